"""``azureml.core``: only ``azureml.core.run`` is provided."""

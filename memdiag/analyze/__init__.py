"""From records to conclusions: summary, prediction model and verification."""

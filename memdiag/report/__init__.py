"""Rendering: reporters take computed data and an output; they compute nothing."""

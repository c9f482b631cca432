"""The engines loadgen launches: one module each, listed in ``registry``."""

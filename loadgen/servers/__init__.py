"""Launch data shipped with loadgen: the model catalogue and engine settings presets."""

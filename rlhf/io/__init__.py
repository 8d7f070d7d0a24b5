"""Writing files safely (`atomic`): below every package that writes checkpoints or exports."""

//! Torch zip archives and the safetensors bridge (not yet implemented: see the checkpoints issue).

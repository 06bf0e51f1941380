//! Safe torch-pickle reader and writer (not yet implemented: see the checkpoints issue).

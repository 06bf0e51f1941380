//! pm-trace v1 reader, writer and replay (not yet implemented: see the conformance issue).

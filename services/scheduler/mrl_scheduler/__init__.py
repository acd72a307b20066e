"""mrl_scheduler: Multi-Worker Resource Allocation (MWRA), the GPU lease scheduler (docs/architecture.md)."""

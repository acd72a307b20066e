"""The benches, one module per `mrl bench NAME` (mrl_research.cli registers them); each `main(quick=...)` ends
with one JSON line."""

"""mrl_research: the experiments beside the product, which no service, launcher or SDK module imports.

    bench/          `mrl bench exchange|align|scheduler|trainer|guard|hacpo|trl|mutual`: each ends with one JSON line
    benchmarking    the machine description the benches print, and cleaning up their Redis keys
    simulation      simulated workers through the lease scheduler, in virtual time (bench scheduler, its tests)
    exchange_demo   `mrl demo --exchange`: two synthetic producers through a real exchange
    lab/            `mrl lab bandit`, `mrl lab signal`: fast testbeds of the sharing modes
    cli             the commands, registered as entry points `mrl.commands`

research/scripts/ holds one-off probes run as scripts (.venv/bin/python research/scripts/NAME.py).
What a deployment runs stays in the service packages; install this one with `pip install -e research`.
"""

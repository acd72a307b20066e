"""mrl_launcher: runs a topology as local processes and reads what its trainers wrote.

    topology     `mrl up` / `mrl demo`: embedded Redis, the installed services, N trainers, a report
    experiment   `mrl experiment compare`: the same policies under each sharing mode
    analysis     loading runs (metrics.jsonl) and comparing modes: pure, JSON out
    figures      PNGs of runs and comparisons (matplotlib)
    report       HTML pages of a run and of a comparison
    cli          the commands, registered as entry points `mrl.commands`

It sits on top of the other packages: it starts the services (mrl_serving.processes) and runs
`mrl trainer run`; nothing below imports it.
"""

"""The device now: the simulated GPU's ledger that separate processes take memory from, readings of a
device (NVML, the ledger, free memory only) as plain snapshots, and the watcher that owns the latest one.
No Qt and no HTTP here: the service, the policy and the tray read what the watcher publishes."""

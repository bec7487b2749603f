"""The benchmark harness: the technique ladder, the founding document's claims, time-to-accuracy, and the tuner.

Every figure comes from cnnpar's own engine (the Trainer's set-up and its `TrainStep`, the step
`cnnpar train` runs), measured in one process and one sitting, and is written as flat CSV rows
that carry the device, driver, torch version, world size, git revision and date.
"""

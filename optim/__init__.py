"""ctensor.optim: optimizers whose states follow their parameters' placement and SBP."""

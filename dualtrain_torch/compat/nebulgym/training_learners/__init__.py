"""nebulgym's ``training_learners`` package: `base` (TrainingLearner) and `model_engines`."""

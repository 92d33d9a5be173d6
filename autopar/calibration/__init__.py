"""Fitting the cost model to measured runs (fit) and the leave-one-source-out check that refits it
without each source (loso). Above the run prediction it fits to (autopar.validate), below the api."""

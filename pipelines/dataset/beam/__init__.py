"""The build's steps as Beam transforms: tokenizing into windows, encoding words (RunInference) and
the whole build pipeline (`BuildDataset`)."""

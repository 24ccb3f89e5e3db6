"""Graph-rewriting optimizer for video and audio VAE decoders."""

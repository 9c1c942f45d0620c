"""How well it predicts and routes: the evaluate harness over the registry's splits, and new models held out."""

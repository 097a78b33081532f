"""The simulated device (--backend sim): a Runner that runs no model. The ranks still take
every plan over the real mesh and keep their block tables, but tokens are a pure hash
(tokens.py), drafts are right with a profile's acceptance (acceptance.py), and a step
takes the wall time a cost profile gives it (profile.py, cost.py). Imports no torch."""

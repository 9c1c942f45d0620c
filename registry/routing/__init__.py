"""Which model should answer a query: the routing state, query texts and their vectors, the policy and its
options, the routing log, and the cost-accuracy frontier."""

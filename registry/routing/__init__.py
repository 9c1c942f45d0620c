"""Which model should answer a query, at run time: the routing state, the served policy and the terms as routing keeps
them, query texts and their vectors, the decision and its options, the routing log, and the cost-accuracy frontier."""

"""Policy -> plan: validation of a policy into a typed Plan without loading weights (validate) and the matrix of
runners x laws x load points x prompts with its run order (matrix).
"""

from posttrain.envs import instruction  # noqa: F401
from posttrain.envs import longctx  # noqa: F401

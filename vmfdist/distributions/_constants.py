"""Numerical constants shared by the distributions (each defined once)."""
import math

#: The Euler--Mascheroni constant.
EULER_GAMMA = 0.57721566490153286060651209008240243
#: log(2 pi).
LOG_2PI = math.log(2.0 * math.pi)

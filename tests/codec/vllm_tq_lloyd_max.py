#!/usr/bin/env python3
"""A second computation of vLLM's TurboQuant key codebook (its solve_lloyd_max: Lloyd-Max for
N(0, 1/d), trapezoid rule over 200 intervals, cells cut at the midpoints, outer edges at +-10.5
sigma, start evenly spaced on +-3.5 sigma, stop when no centroid moves by 1e-10 -- keeping the
iterate before that move -- or after 200 updates), written apart from kvq's C++: the density in
standard units, the trapezoid sums as one list each. Prints the number of updates, then each
centroid as float32 bits in hex.   usage: vllm_tq_lloyd_max.py D BITS"""
import math
import struct
import sys

d, bits = int(sys.argv[1]), int(sys.argv[2])
levels = 2 ** bits
sd = math.sqrt(1.0 / d)


def density(x):
    z = x / sd
    return math.exp(-0.5 * z * z) / (sd * math.sqrt(2.0 * math.pi))


def cell_mean(a, b, steps=200):
    width = (b - a) / steps
    xs = [a + k * width for k in range(steps + 1)]
    w = [0.5 if k in (0, steps) else 1.0 for k in range(steps + 1)]
    mass = sum(wk * density(x) for wk, x in zip(w, xs)) * width
    moment = sum(wk * x * density(x) for wk, x in zip(w, xs)) * width
    return mass, moment


centres = [-3.5 * sd + 7.0 * sd * (k + 0.5) / levels for k in range(levels)]
updates = 0
while updates < 200:
    cuts = [-10.5 * sd] + [(centres[k] + centres[k + 1]) / 2.0 for k in range(levels - 1)] + [10.5 * sd]
    moved = []
    for k in range(levels):
        mass, moment = cell_mean(cuts[k], cuts[k + 1])
        moved.append(moment / mass if mass > 1e-15 else centres[k])
    if max(abs(m - c) for m, c in zip(moved, centres)) < 1e-10:
        break
    centres = moved
    updates += 1
print(updates, " ".join(struct.pack("<f", c).hex() for c in centres))

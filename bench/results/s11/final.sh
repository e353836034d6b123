#!/usr/bin/env bash
# Session 11 final check of HEAD: the commands of session 10's final check (bench/results/s10/final.sh: carry .ab =
# git archive HEAD with .gtest inside; fused.sh from .ab/head, then three paired processes at L=4096, one at 16384).
exec bash bench/results/s10/final.sh

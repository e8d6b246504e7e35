-- Values compressed as deltas of their IEEE 754 bits, then ZSTD(3): consecutive readings of
-- a series (the sort key keeps them together) share sign, exponent and leading mantissa
-- bits. Measured on the benchmark's 2.4 M readings, bytes on disk per reading (all columns):
-- noisy floats 7.01 -> 6.10, integer values 2.66 -> 2.56; insert CPU about the same (+10%);
-- values read back bit-exact. (Gorilla+ZSTD(3): 6.32 / 2.64; FPC(1)+ZSTD(3): 6.00 / 2.63;
-- Delta+ZSTD(9) and higher: smaller, but 30-150% more CPU at every insert and merge.)
-- Applies to parts written from now on, older ones as they merge.
ALTER TABLE metrics MODIFY COLUMN value Float64 CODEC(Delta, ZSTD(3))

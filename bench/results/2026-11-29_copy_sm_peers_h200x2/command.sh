WS=2 bash bench/device.sh copy-sm   # nvidia-h200-x2, 2026-11-29; 11 s

//! NVMe 2.0 base and NVMe-oF 1.1 wire formats: one module per spec area.

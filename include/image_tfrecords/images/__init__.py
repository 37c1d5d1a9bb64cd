"""One image at a time: probing and checking its bytes (JPEG markers, PNG stream, HEIC/AVIF/JPEG XL),
and making the image a record stores (resize, re-encode, raw pixels); demo images."""

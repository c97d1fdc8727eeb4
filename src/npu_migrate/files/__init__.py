"""Files of each kind: finding them (`discovery`), telling their kind (`kinds`), reading and writing them without
losing a byte (`source`), and notebooks (`notebooks`). A new kind of file starts in `kinds`."""

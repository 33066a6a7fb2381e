package keystore

import "os"

func writeFile(name, s string) error { return os.WriteFile(name, []byte(s), 0o600) }

package main

import (
	"errors"
	"os"
	"path/filepath"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
)

// ensureGossipKey returns the lab's cluster gossip key file
// (<dir>/gossip.key, mode 0600), generating it once: every coordinator
// starts with it and seeds the replicated keyring; agents get the keyring
// when they enroll.
func ensureGossipKey(dir string) (string, error) {
	path := filepath.Join(dir, "gossip.key")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	return path, enroll.GenerateGossipKeyFile(path)
}

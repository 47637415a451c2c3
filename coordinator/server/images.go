package server

import (
	"path/filepath"

	"github.com/gpuaas/gpuaas/coordinator/blobs"
)

// Blobs is this replica's image blob store (DataDir/blobs), opened on
// first use; nil (with the error logged once) when it cannot be opened.
func (s *Server) Blobs() *blobs.Store {
	s.blobsOnce.Do(func() {
		s.blobs, s.blobsErr = blobs.Open(filepath.Join(s.cfg.DataDir, "blobs"))
		if s.blobsErr != nil {
			s.log.Error("image blob store unavailable", "err", s.blobsErr)
		}
	})
	return s.blobs
}

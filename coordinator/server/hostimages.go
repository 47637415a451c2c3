package server

import (
	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/maasflow"
	"github.com/gpuaas/gpuaas/proto"
)

// ledgerImages answers the MAAS predeploy image check from the ledger's
// image catalog.
type ledgerImages struct{ s *Server }

var _ maasflow.ImageCatalog = ledgerImages{}

func (l ledgerImages) ApprovedHostImage(site, profile string) (maasflow.HostImage, bool, error) {
	snap := l.s.Store().Snapshot()
	im, ok := fsm.ApprovedHostImage(snap, site, profile)
	if !ok {
		for _, x := range snap.Images("") {
			if x.Kind.MAASFileType() != "" {
				return maasflow.HostImage{}, false, nil
			}
		}
		return maasflow.HostImage{}, false, maasflow.ErrNoHostImages
	}
	return maasflow.HostImage{Name: im.Name, Version: im.Version, Kind: string(im.Kind), SHA256: proto.DigestHex(im.Digest)}, true, nil
}

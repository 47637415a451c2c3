package main

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/coordinator/server"
)

// loadTLS finds the cluster CA and issues this server's certificate for
// every address it is reached at. The CA is -ca-cert/-ca-key, or the one
// kept in <data-dir>/tls; a server that bootstraps a cluster alone (no
// -join, -bootstrap-expect 1) creates it there on first start. Servers of
// a larger cluster are given the same CA files.
func loadTLS(o *options, httpAdvertise, raftAdvertise string, log *slog.Logger) (*server.TLSConfig, error) {
	if o.InsecureHTTP {
		log.Warn("-insecure-http: the API, Raft and the peer calls are plain text")
		return nil, nil
	}
	now := time.Now()
	var ca *pki.CA
	var err error
	if o.CACert != "" {
		if ca, err = pki.LoadCA(o.CACert, o.CAKey); err != nil {
			return nil, err
		}
	} else {
		dir := filepath.Join(o.DataDir, "tls")
		create := o.BootstrapExpect <= 1 && len(o.Join) == 0
		var created bool
		ca, created, err = pki.LoadOrCreate(dir, create, now)
		if err != nil {
			if !create {
				return nil, fmt.Errorf("%w: a server that joins others needs the cluster CA: give -ca-cert and -ca-key (the first server keeps them in its <data-dir>/tls)", err)
			}
			return nil, err
		}
		if created {
			log.Info("created the cluster CA", "cert", filepath.Join(dir, pki.CACertFile), "key", filepath.Join(dir, pki.CAKeyFile))
		}
	}
	hosts := []string{"127.0.0.1", "::1", "localhost"}
	if h, err := os.Hostname(); err == nil {
		hosts = append(hosts, h)
	}
	for _, a := range []string{o.HTTPAddr, httpAdvertise, o.RaftAddr, raftAdvertise} {
		if h, _, err := net.SplitHostPort(a); err == nil && h != "" {
			hosts = append(hosts, h)
		}
	}
	hosts = append(hosts, o.TLSSANs...)
	cert, err := ca.IssueServer(o.NodeID, hosts, now, pki.ServerTTL)
	if err != nil {
		return nil, err
	}
	return &server.TLSConfig{CA: ca, Cert: cert, NodeCertTTL: o.NodeCertTTL}, nil
}

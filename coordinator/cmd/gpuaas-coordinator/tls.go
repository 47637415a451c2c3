package main

import (
	"context"
	"crypto/x509"
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
// kept in <data-dir>/tls. On first start a server that bootstraps alone
// (-bootstrap-expect 1, no -join) creates one there; servers that form a
// cluster together (-bootstrap-expect > 1) derive the same one from their
// shared cluster secret; a server joining with a join token gets it from
// the cluster during the join (fetchCA).
func loadTLS(ctx context.Context, o *options, clusterSecret, joinToken, httpAdvertise, raftAdvertise string, log *slog.Logger) (*server.TLSConfig, error) {
	if o.InsecureHTTP {
		log.Warn("-insecure-http: the API, Raft and the peer calls are plain text")
		return nil, nil
	}
	now := time.Now()
	var ca *pki.CA
	var trusted []*x509.Certificate
	var err error
	dir := filepath.Join(o.DataDir, "tls")
	rotated, rtrusted, ok, err := server.LoadRotation(dir)
	if err != nil {
		return nil, err
	}
	if ok {
		// A CA rotation happened: the replicated table's CAs, as this
		// server last followed them, win over -ca-cert and the derived
		// or kept CA (Raft replays the table once the server is up).
		ca, trusted = rotated, rtrusted
		log.Info("using the cluster CA of the last rotation", "file", filepath.Join(dir, server.RotationFile), "active", pki.ID(ca.Cert))
	} else if o.CACert != "" {
		if ca, err = pki.LoadCA(o.CACert, o.CAKey); err != nil {
			return nil, err
		}
	} else {
		create := o.BootstrapExpect <= 1 && len(o.Join) == 0
		var created bool
		ca, created, err = pki.LoadOrCreate(dir, create, now)
		switch {
		case err == nil && created:
			log.Info("created the cluster CA", "cert", filepath.Join(dir, pki.CACertFile), "key", filepath.Join(dir, pki.CAKeyFile))
		case err == nil:
		case create:
			return nil, err
		case o.BootstrapExpect > 1 && clusterSecret != "":
			if ca, err = pki.DeriveCA(clusterSecret, now); err != nil {
				return nil, err
			}
			log.Info("derived the cluster CA from the cluster secret", "cert", filepath.Join(dir, pki.CACertFile))
		case joinToken != "" || clusterSecret != "":
			if ca, err = fetchCA(ctx, o, joinToken, clusterSecret, log); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("%w: give -ca-cert and -ca-key (the first server keeps them in its <data-dir>/tls)", err)
		}
		if err := ca.Keep(dir); err != nil {
			return nil, err
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
	return &server.TLSConfig{CA: ca, Cert: cert, NodeCertTTL: o.NodeCertTTL, Trusted: trusted}, nil
}

// fetchCA gets the cluster CA from the join addresses (2 minutes at most).
func fetchCA(ctx context.Context, o *options, joinToken, clusterSecret string, log *slog.Logger) (*pki.CA, error) {
	cred := joinToken
	if cred == "" {
		cred = clusterSecret
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return server.FetchCA(ctx, o.Join, o.NodeID, cred, log)
}

package daemon

import (
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/internal/atomicfile"
	"github.com/gpuaas/gpuaas/proto"
)

// The node's client certificate (mutual TLS on the agent routes) and its
// key, in the state directory.
const (
	CertFile = "node.crt"
	KeyFile  = "node.key"
	// CABundleFile keeps the cluster CA bundle of the last rotation.
	CABundleFile = "ca-bundle.json"
)

// usesTLS reports whether any coordinator is an https URL.
func usesTLS(urls []string) bool {
	for _, u := range urls {
		if strings.HasPrefix(u, "https://") {
			return true
		}
	}
	return false
}

// setupTLS makes the client trust the cluster CA and loads the node's
// certificate kept from an earlier run.
func (d *Daemon) setupTLS() error {
	if !usesTLS(d.cfg.Coordinators) {
		return nil
	}
	var err error
	if d.cfg.CAFile != "" {
		if d.caPool, err = pki.LoadPool(d.cfg.CAFile); err != nil {
			return err
		}
	}
	// A bundle a coordinator sent (a CA rotation) is newer than the
	// configured CA file: it wins.
	if b, err := loadCABundle(d.cfg.StateDir); err != nil {
		d.log.Warn("CA bundle kept in the state directory is unreadable; using the CA file", "err", err)
	} else if b != nil {
		pool, err := pki.PoolFromPEM([]byte(b.PEM))
		if err != nil {
			return fmt.Errorf("CA bundle %s: %w", filepath.Join(d.cfg.StateDir, CABundleFile), err)
		}
		d.caPool, d.caBundle = pool, b
	}
	d.client.UseTLS(d.caPool)
	certPEM, err := os.ReadFile(filepath.Join(d.cfg.StateDir, CertFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read node certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(d.cfg.StateDir, KeyFile))
	if err != nil {
		return fmt.Errorf("read node key: %w", err)
	}
	key, err := pki.ParseKeyPEM(keyPEM)
	if err != nil {
		return fmt.Errorf("node key %s: %w", filepath.Join(d.cfg.StateDir, KeyFile), err)
	}
	cert, err := pki.KeyPair(certPEM, key)
	if err != nil {
		return fmt.Errorf("node certificate %s: %w", filepath.Join(d.cfg.StateDir, CertFile), err)
	}
	d.client.SetCertificate(&cert)
	return nil
}

// newCSR makes a fresh key and CSR for the node (nil CSR without TLS).
func (d *Daemon) newCSR() (*ecdsa.PrivateKey, string, error) {
	if !usesTLS(d.cfg.Coordinators) {
		return nil, "", nil
	}
	key, csr, err := pki.NewNodeKey(d.cfg.NodeID)
	if err != nil {
		return nil, "", err
	}
	return key, string(csr), nil
}

// storeCert keeps a signed certificate and its key and presents it from
// now on.
func (d *Daemon) storeCert(key *ecdsa.PrivateKey, certPEM string) error {
	cert, err := pki.KeyPair([]byte(certPEM), key)
	if err != nil {
		return fmt.Errorf("node certificate from the coordinator: %w", err)
	}
	keyPEM, err := pki.EncodeKeyPEM(key)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(d.cfg.StateDir, KeyFile), keyPEM, 0o600); err != nil {
		return fmt.Errorf("store node key: %w", err)
	}
	if err := atomicfile.WriteFile(filepath.Join(d.cfg.StateDir, CertFile), []byte(certPEM), 0o644); err != nil {
		return fmt.Errorf("store node certificate: %w", err)
	}
	d.client.SetCertificate(&cert)
	d.log.Info("node certificate stored", "serial", pki.SerialHex(cert.Leaf), "not_after", cert.Leaf.NotAfter)
	return nil
}

// renewAt is when a certificate is renewed: at two thirds of its lifetime.
func renewAt(c *tls.Certificate) time.Time {
	life := c.Leaf.NotAfter.Sub(c.Leaf.NotBefore)
	return c.Leaf.NotBefore.Add(life * 2 / 3)
}

// renewCert gets a new certificate when there is none or the current one
// is past two thirds of its lifetime.
func (d *Daemon) renewCert(ctx context.Context, now time.Time) error {
	if !usesTLS(d.cfg.Coordinators) {
		return nil
	}
	if c := d.client.Certificate(); c != nil && now.Before(renewAt(c)) {
		return nil
	}
	return d.renewCertNow(ctx)
}

// renewCertNow gets a new certificate for the node.
func (d *Daemon) renewCertNow(ctx context.Context) error {
	key, csr, err := d.newCSR()
	if err != nil {
		return err
	}
	resp, err := d.client.RenewCertificate(ctx, csr)
	if err != nil {
		return fmt.Errorf("renew node certificate: %w", err)
	}
	return d.storeCert(key, resp.Certificate)
}

// certLoop renews the node's certificate before it expires.
func (d *Daemon) certLoop(ctx context.Context) error {
	if !usesTLS(d.cfg.Coordinators) {
		return nil
	}
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		if err := d.renewCert(ctx, time.Now()); err != nil && ctx.Err() == nil {
			d.log.Warn("node certificate", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// loadCABundle reads the kept CA bundle (nil when there is none).
func loadCABundle(dir string) (*proto.CABundle, error) {
	b, err := os.ReadFile(filepath.Join(dir, CABundleFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var cb proto.CABundle
	if err := json.Unmarshal(b, &cb); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, CABundleFile), err)
	}
	return &cb, nil
}

// caBundleVersion is the version of the CA bundle the agent trusts (""
// for its CA file).
func (d *Daemon) caBundleVersion() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.caBundle == nil {
		return ""
	}
	return d.caBundle.Version
}

// setCABundle trusts the CAs a coordinator sent (a CA rotation), keeps
// them in the state directory and, when the active CA did not sign the
// node's certificate, renews it at once.
func (d *Daemon) setCABundle(ctx context.Context, b proto.CABundle) error {
	pool, err := pki.PoolFromPEM([]byte(b.PEM))
	if err != nil {
		return fmt.Errorf("CA bundle from the coordinator: %w", err)
	}
	active, err := pki.ParseCertPEM([]byte(b.Active))
	if err != nil {
		return fmt.Errorf("CA bundle from the coordinator: active CA: %w", err)
	}
	raw, err := json.Marshal(b)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(d.cfg.StateDir, CABundleFile), raw, 0o644); err != nil {
		return fmt.Errorf("keep the CA bundle: %w", err)
	}
	d.mu.Lock()
	d.caPool, d.caBundle = pool, &b
	d.mu.Unlock()
	d.client.SetRoots(pool)
	d.log.Info("CA bundle from the coordinator: trusting it", "version", b.Version, "active", pki.ID(active))
	if c := d.client.Certificate(); c != nil && !pki.SignedBy(c.Leaf, active) {
		d.log.Info("the active CA did not sign this node's certificate: renewing it now", "serial", pki.SerialHex(c.Leaf), "active", pki.ID(active))
		return d.renewCertNow(ctx)
	}
	return nil
}

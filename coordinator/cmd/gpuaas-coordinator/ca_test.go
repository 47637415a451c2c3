package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/client"
	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/coordinator/server"
	"github.com/gpuaas/gpuaas/coordinator/server/proctest"
	"github.com/gpuaas/gpuaas/proto"
)

// rotationAgent is an enrolled agent the way the agent daemon behaves in
// a CA rotation: it heartbeats with the bundle version it trusts, trusts
// the bundle a heartbeat brings and renews its certificate when the
// active CA did not sign it.
type rotationAgent struct {
	cl      *client.Client
	mu      sync.Mutex
	version string
	ok      atomic.Int64 // heartbeats answered
	lastErr atomic.Pointer[string]
	renewed atomic.Int64
}

func (a *rotationAgent) beat(ctx context.Context) error {
	a.mu.Lock()
	v := a.version
	a.mu.Unlock()
	resp, err := a.cl.Heartbeat(ctx, proto.HeartbeatRequest{CABundleVersion: v})
	if err != nil {
		return err
	}
	a.ok.Add(1)
	if b := resp.CABundle; b != nil {
		pool, err := pki.PoolFromPEM([]byte(b.PEM))
		if err != nil {
			return err
		}
		active, err := pki.ParseCertPEM([]byte(b.Active))
		if err != nil {
			return err
		}
		a.cl.SetRoots(pool)
		a.mu.Lock()
		a.version = b.Version
		a.mu.Unlock()
		if !pki.SignedBy(a.cl.Certificate().Leaf, active) {
			key, csr, err := pki.NewNodeKey("x")
			if err != nil {
				return err
			}
			cr, err := a.cl.RenewCertificate(ctx, string(csr))
			if err != nil {
				return err
			}
			kp, err := pki.KeyPair([]byte(cr.Certificate), key)
			if err != nil {
				return err
			}
			a.cl.SetCertificate(&kp)
			a.renewed.Add(1)
		}
	}
	return nil
}

// TestCARotationOfAThreeServerCluster rotates the cluster CA of three
// coordinator processes with an enrolled agent: introduce (trusted beside
// the old one), activate once the agent holds the bundle (coordinators
// re-issue their certificates, the agent renews), retire once the agent's
// certificate is the new CA's. Quorum and the agent's heartbeats hold
// throughout; afterwards a certificate of the retired CA is refused by
// every coordinator, a restarted coordinator comes back with the new CA,
// and every step is in the audit log.
func TestCARotationOfAThreeServerCluster(t *testing.T) {
	c := proctest.Start(t, coordinatorBin, proctest.Options{Inventory: server.SyntheticInventory("us-east", 1, 8)})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	leader, err := c.Leader(ctx)
	require.NoError(t, err)
	node := "us-east-n0000"
	oldCA := c.CA

	// Enroll the agent.
	var bt proto.BootstrapTokenResponse
	var code int
	require.Eventually(t, func() bool { // once the inventory is loaded
		code, err = c.Do(ctx, leader, http.MethodPost, "/v1/nodes/"+node+"/bootstrap-tokens", "", proto.BootstrapTokenCreateRequest{}, &bt)
		return err == nil && code == http.StatusCreated
	}, 30*time.Second, 100*time.Millisecond, "mint a bootstrap token: %v", err)
	var urls []string
	for i := range c.Nodes {
		urls = append(urls, c.URL(i))
	}
	cl, err := client.New(urls, "")
	require.NoError(t, err)
	cl.UseTLS(oldCA.Pool())
	key, csr, err := pki.NewNodeKey(node)
	require.NoError(t, err)
	er, err := cl.EnrollCSR(ctx, node, bt.Token, node, string(csr))
	require.NoError(t, err)
	cl.SetCredential(er.Credential)
	kp, err := pki.KeyPair([]byte(er.Certificate), key)
	require.NoError(t, err)
	cl.SetCertificate(&kp)
	agent := &rotationAgent{cl: cl}
	require.NoError(t, agent.beat(ctx))
	actx, stopAgent := context.WithCancel(ctx)
	var agentDone sync.WaitGroup
	agentDone.Add(1)
	go func() {
		defer agentDone.Done()
		for actx.Err() == nil {
			if err := agent.beat(actx); err != nil && actx.Err() == nil {
				s := err.Error()
				agent.lastErr.Store(&s)
			}
			select {
			case <-actx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	defer func() { stopAgent(); agentDone.Wait() }()

	status := func() proto.CAStatus {
		t.Helper()
		var st proto.CAStatus
		code, err := c.Do(ctx, leader, http.MethodGet, "/v1/operator/ca", "", nil, &st)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, code)
		return st
	}
	st := status()
	require.Len(t, st.CAs, 1)
	assert.Equal(t, pki.ID(oldCA.Cert), st.Active)
	assert.False(t, st.CAs[0].IntroducedAt.IsZero(), "the CA the cluster started with has an introduction time (its certificate's)")

	// 1. Introduce: staged, trusted everywhere.
	var staged proto.CARecord
	code, err = c.Do(ctx, leader, http.MethodPost, "/v1/operator/ca/rotate", "", struct{}{}, &staged)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, code)
	assert.Equal(t, proto.CAStaged, staged.State)
	assert.Empty(t, staged.KeyPEM, "the key is never returned")
	newCert, err := pki.ParseCertPEM([]byte(staged.CertPEM))
	require.NoError(t, err)
	code, err = c.Do(ctx, leader, http.MethodPost, "/v1/operator/ca/rotate", "", struct{}{}, nil)
	require.Error(t, err)
	assert.Equal(t, http.StatusConflict, code, "one staged CA at a time")

	// At once, on a follower (gpuaasctl ca rotate; ca bundle >
	// ca-bundle.pem): the answer is the leader's, so the bundle already
	// holds the staged CA, the table still lists the first CA with its
	// introduction time, and the agents (only the leader hears their
	// heartbeats) are listed.
	follower := (leader + 1) % len(c.Nodes)
	var fst proto.CAStatus
	code, err = c.Do(ctx, follower, http.MethodGet, "/v1/operator/ca", "", nil, &fst)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	fcerts, err := pki.ParseCertsPEM([]byte(fst.BundlePEM))
	require.NoError(t, err)
	require.Len(t, fcerts, 2, "the follower's bundle right after rotate")
	assert.Equal(t, pki.ID(oldCA.Cert), pki.ID(fcerts[0]), "the active CA first")
	assert.Equal(t, staged.ID, pki.ID(fcerts[1]))
	require.Len(t, fst.CAs, 2)
	for _, r := range fst.CAs {
		assert.False(t, r.IntroducedAt.IsZero(), "CA %s's introduction time", r.ID)
	}
	require.NotEmpty(t, fst.Nodes, "a follower's status lists the agents the leader heard")
	assert.Equal(t, node, fst.Nodes[0].NodeID)

	// The test's own client trusts the bundle from now on (once the
	// leader follows the table: both CAs).
	require.Eventually(t, func() bool {
		st = status()
		certs, err := pki.ParseCertsPEM([]byte(st.BundlePEM))
		return err == nil && len(certs) == 2
	}, 10*time.Second, 100*time.Millisecond)
	bundle, err := pki.PoolFromPEM([]byte(st.BundlePEM))
	require.NoError(t, err)
	tr := c.Client.Transport.(*http.Transport).Clone()
	tr.TLSClientConfig = pki.ClientConfig(bundle, nil)
	c.Client = &http.Client{Timeout: 15 * time.Second, Transport: tr}

	// 2. Activate once the agent holds the bundle (409 before).
	var active proto.CARecord
	require.Eventually(t, func() bool {
		code, err := c.Do(ctx, leader, http.MethodPost, "/v1/operator/ca/activate", "", proto.CAActionRequest{}, &active)
		var pe *proto.Error
		if errors.As(err, &pe) && code == http.StatusConflict {
			assert.Contains(t, pe.Detail, node)
			return false
		}
		require.NoError(t, err)
		return code == http.StatusOK
	}, 30*time.Second, 200*time.Millisecond)
	assert.Equal(t, proto.CAActive, active.State)

	// Every coordinator now serves a certificate of the new CA; the agent
	// renewed from it.
	servedBy := func(i int) *x509.Certificate {
		conn, err := tls.Dial("tcp", c.Nodes[i].HTTPAddr, pki.ClientConfig(bundle, nil))
		if err != nil {
			return nil
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0]
	}
	require.Eventually(t, func() bool {
		for i := range c.Nodes {
			if leaf := servedBy(i); leaf == nil || !pki.SignedBy(leaf, newCert) {
				return false
			}
		}
		return pki.SignedBy(cl.Certificate().Leaf, newCert)
	}, 30*time.Second, 200*time.Millisecond, "coordinators and the agent move to the new CA")

	// 3. Retire the old CA once the agent's newest certificate is the new one's.
	var retired proto.CARecord
	require.Eventually(t, func() bool {
		code, err := c.Do(ctx, leader, http.MethodPost, "/v1/operator/ca/retire", "", proto.CAActionRequest{}, &retired)
		if code == http.StatusConflict {
			return false
		}
		require.NoError(t, err)
		return code == http.StatusOK
	}, 30*time.Second, 200*time.Millisecond)
	assert.Equal(t, proto.CARetired, retired.State)
	assert.Equal(t, pki.ID(oldCA.Cert), retired.ID)

	// The agent keeps working: heartbeats after the retirement succeed.
	before := agent.ok.Load()
	require.Eventually(t, func() bool { return agent.ok.Load() >= before+3 }, 20*time.Second, 100*time.Millisecond,
		"the agent's heartbeats stopped; last error: %v", agent.lastErr.Load())
	assert.Positive(t, agent.renewed.Load())

	// A certificate of the retired CA is refused by every coordinator,
	// and a client trusting only the retired CA cannot verify them.
	oldKey, oldCSR, err := pki.NewNodeKey(node)
	require.NoError(t, err)
	oldPEM, _, err := oldCA.SignNodeCSR(oldCSR, node, time.Now(), time.Hour)
	require.NoError(t, err)
	oldPair, err := pki.KeyPair(oldPEM, oldKey)
	require.NoError(t, err)
	for i := range c.Nodes {
		cfg := pki.ClientConfig(bundle, nil)
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &oldPair, nil }
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL(i)+proto.AgentHeartbeatPath, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+er.Credential)
		res, err := hc.Do(req)
		if err == nil {
			res.Body.Close()
		}
		require.Error(t, err, "server %d accepted a certificate of the retired CA", i)
		assert.Contains(t, err.Error(), "certificate", "server %d", i)

		old := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: pki.ClientConfig(oldCA.Pool(), nil)}}
		_, err = old.Get(c.URL(i) + "/readyz")
		require.Error(t, err, "server %d still presents a certificate of the retired CA", i)
	}
	// The agent holds the bundle of the retirement after its next heartbeat.
	require.Eventually(t, func() bool {
		st = status()
		return len(st.Nodes) == 1 && st.Nodes[0].Current
	}, 20*time.Second, 100*time.Millisecond, "the agent reports the current bundle: %+v", st.Nodes)
	require.Len(t, st.CAs, 2)
	assert.Equal(t, staged.ID, st.Active)
	assert.Equal(t, staged.ID, st.Nodes[0].CertCA)

	// Quorum held: a write commits, and a restarted follower (started with
	// the old -ca-cert) comes back with the new CA from its rotation state.
	follower = (leader + 1) % len(c.Nodes)
	require.NoError(t, c.Stop(follower))
	c.StartNode(follower)
	require.Eventually(t, func() bool {
		st, err := c.Status(ctx, follower)
		return err == nil && st.LeaderHTTPAddr != ""
	}, 30*time.Second, 200*time.Millisecond, "the restarted follower rejoins")
	leaf := servedBy(follower)
	require.NotNil(t, leaf)
	assert.True(t, pki.SignedBy(leaf, newCert))
	code, err = c.Do(ctx, leader, http.MethodPost, "/v1/nodes/"+node+"/drain", "", map[string]string{}, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)

	// Every step is in the audit log.
	var l proto.List[proto.AuditRecord]
	code, err = c.Do(ctx, leader, http.MethodGet, "/v1/audit?limit=500", "", nil, &l)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	var steps []string
	for _, r := range l.Items {
		if r.Route == "/v1/operator/ca/rotate" || r.Route == "/v1/operator/ca/activate" || r.Route == "/v1/operator/ca/retire" {
			steps = append(steps, r.Route+" "+http.StatusText(r.Status))
		}
	}
	assert.Contains(t, steps, "/v1/operator/ca/rotate Created")
	assert.Contains(t, steps, "/v1/operator/ca/activate OK")
	assert.Contains(t, steps, "/v1/operator/ca/retire OK")
	b, _ := json.Marshal(steps)
	t.Logf("audited CA steps: %s", b)
}

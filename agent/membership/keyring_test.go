package membership

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func newKey(t *testing.T) []byte {
	t.Helper()
	k := make([]byte, 32)
	_, err := rand.Read(k)
	require.NoError(t, err)
	return k
}

func startKeyed(t *testing.T, name string, keys ...[]byte) *Pool {
	t.Helper()
	p, err := Start(Config{Name: name, Meta: Meta{Role: RoleAgent, NodeID: name}, Logger: quiet(), Keys: keys})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Shutdown() })
	return p
}

// A member without the cluster key, or with another key, cannot join an
// encrypted pool: memberlist cannot decrypt (or refuses the plaintext of)
// what it sends, so nothing it claims reaches the members.
func TestEncryptedPoolRefusesMembersWithoutTheKey(t *testing.T) {
	key := newKey(t)
	coord := startKeyed(t, "coord-1", key)
	ok := startKeyed(t, "node-ok", key)
	_, err := ok.Join([]string{coord.Addr()})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return coord.NumMembers() == 2 }, 5*time.Second, 20*time.Millisecond)

	plain, err := Start(Config{Name: "node-plain", Meta: Meta{Role: RoleAgent, NodeID: "node-ok"}, Logger: quiet()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = plain.Shutdown() })
	_, err = plain.Join([]string{coord.Addr()})
	require.Error(t, err, "a plaintext member joins an encrypted pool")

	wrong := startKeyed(t, "node-wrong", newKey(t))
	_, err = wrong.Join([]string{coord.Addr()})
	require.Error(t, err, "a member with another key joins")

	time.Sleep(500 * time.Millisecond) // give any leaked gossip time to arrive
	require.Equal(t, 2, coord.NumMembers())
	for _, st := range coord.Statuses() {
		require.Equal(t, "node-ok", st.Name, "only the keyed member is known")
	}
}

// Rotation as Consul does it (install everywhere, use, remove the old
// key) keeps the pool formed, and afterwards only the new key admits.
func TestKeyRotationKeepsThePool(t *testing.T) {
	old, next := newKey(t), newKey(t)
	var pools []*Pool
	for i := 0; i < 4; i++ {
		p := startKeyed(t, fmt.Sprintf("m-%d", i), old)
		if i > 0 {
			_, err := p.Join([]string{pools[0].Addr()})
			require.NoError(t, err)
		}
		pools = append(pools, p)
	}
	formed := func() bool {
		for _, p := range pools {
			if p.NumMembers() != len(pools) {
				return false
			}
		}
		return true
	}
	require.Eventually(t, formed, 10*time.Second, 20*time.Millisecond)

	for _, step := range [][][]byte{{old, next}, {next, old}, {next}} {
		for _, p := range pools {
			require.NoError(t, p.SetKeyring(step))
		}
		time.Sleep(1500 * time.Millisecond) // several probe rounds under the new keyring
		require.True(t, formed(), "the pool stays formed after keyring %d keys", len(step))
	}
	for _, p := range pools {
		ks := p.Keys()
		require.Len(t, ks, 1)
		require.True(t, bytes.Equal(next, ks[0]))
	}
	stale := startKeyed(t, "m-stale", old)
	_, err := stale.Join([]string{pools[0].Addr()})
	require.Error(t, err, "the removed key still admits")
	fresh := startKeyed(t, "m-fresh", next)
	_, err = fresh.Join([]string{pools[0].Addr()})
	require.NoError(t, err)

	plain, err := Start(Config{Name: "p", Logger: quiet()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = plain.Shutdown() })
	require.ErrorContains(t, plain.SetKeyring([][]byte{next}), "without a gossip keyring")
	require.ErrorContains(t, pools[0].SetKeyring(nil), "empty gossip keyring")
}

// The member proof binds credential, node, member name and address.
func TestProveAndVerify(t *testing.T) {
	h := CredentialHash("gpn_secret")
	st := Status{Name: "j27u15", Addr: "10.0.0.5:7946", Meta: Meta{Role: RoleAgent, NodeID: "j27u15"}}
	st.Meta.Proof = Prove(h, "j27u15", "j27u15", "10.0.0.5:7946")
	require.True(t, Verify(h, st))

	for name, mut := range map[string]func(*Status){
		"other credential": func(s *Status) {
			s.Meta.Proof = Prove(CredentialHash("gpn_other"), "j27u15", "j27u15", "10.0.0.5:7946")
		},
		"other node":    func(s *Status) { s.Meta.NodeID = "j27u16" },
		"other name":    func(s *Status) { s.Name = "evil" },
		"other address": func(s *Status) { s.Addr = "10.0.0.66:7946" },
		"no proof":      func(s *Status) { s.Meta.Proof = "" },
	} {
		s := st
		mut(&s)
		require.False(t, Verify(h, s), name)
	}
	require.False(t, Verify("", st), "no credential on record")
}

// A member started with Prove gossips the proof of its bound address.
func TestProofGossipedWithBoundAddress(t *testing.T) {
	key := newKey(t)
	coord := startKeyed(t, "coord-1", key)
	h := CredentialHash("gpn_x")
	a, err := Start(Config{Name: "node-a", Meta: Meta{Role: RoleAgent, NodeID: "node-a"}, Logger: quiet(), Keys: [][]byte{key},
		Prove: func(addr string) string { return Prove(h, "node-a", "node-a", addr) }})
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Shutdown() })
	_, err = a.Join([]string{coord.Addr()})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		for _, st := range coord.Statuses() {
			if st.Name == "node-a" && Verify(h, st) {
				return true
			}
		}
		return false
	}, 5*time.Second, 20*time.Millisecond)
}

package cli

import (
	"fmt"
	"maps"
	"net/http"
	"slices"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/proto"
)

// gossipKeyCmd manages the cluster gossip keyring, Consul's `consul
// keyring` model: install a new key (every coordinator takes it within a
// second, every agent with its next heartbeat), use it as primary, remove
// the old one.
func (a *app) gossipKeyCmd() *cobra.Command {
	c := &cobra.Command{Use: "gossip-key", Short: "Gossip encryption keyring: generate, list, install, use, remove (admin)"}
	keyring := func(w *tabwriter.Writer, k proto.GossipKeyring) {
		row(w, "KEY", "FINGERPRINT", "PRIMARY")
		for _, key := range k.Keys {
			row(w, key, enroll.Fingerprint(key), yesNo(key == k.Primary))
		}
		row(w, "Version:", k.Version)
	}
	var force bool
	op := func(o proto.GossipKeyringOp, short string) *cobra.Command {
		c := &cobra.Command{
			Use:   string(o) + " KEY",
			Short: short,
			Args:  exactArgs("KEY"),
			RunE: func(cmd *cobra.Command, args []string) error {
				if _, err := proto.DecodeGossipKey(args[0]); err != nil {
					return usageError{err}
				}
				r, err := a.call(cmd, http.MethodPost, "/v1/operator/gossip-keys", nil, proto.GossipKeyringOpRequest{Op: o, Key: args[0], Force: force}, nil)
				if err != nil {
					return err
				}
				return show(a, r, keyring)
			},
		}
		if o != proto.GossipKeyInstall {
			c.Flags().BoolVar(&force, "force", false, "apply even though live members do not hold the current keyring yet")
		}
		return c
	}
	c.AddCommand(&cobra.Command{
		Use:   "generate",
		Short: "Print a new random gossip key (base64, 32 bytes; offline)",
		Args:  exactArgs(),
		RunE: func(*cobra.Command, []string) error {
			_, err := fmt.Fprintln(a.out, enroll.NewGossipKey())
			return err
		},
	}, &cobra.Command{
		Use:   "list",
		Short: "List the cluster's gossip keys (the primary encrypts, every key decrypts)",
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := a.call(cmd, http.MethodGet, "/v1/operator/gossip-keys", nil, nil, nil)
			if err != nil {
				return err
			}
			return show(a, r, func(w *tabwriter.Writer, v proto.GossipKeyringView) {
				keyring(w, v.GossipKeyring)
				vs := slices.Sorted(maps.Keys(v.Members))
				for _, ver := range vs {
					row(w, fmt.Sprintf("Members at version %d:", ver), v.Members[ver])
				}
			})
		},
	},
		op(proto.GossipKeyInstall, "Install a key on every member (step 1 of a rotation)"),
		op(proto.GossipKeyUse, "Make an installed key primary (step 2; refused until every live member holds the keyring)"),
		op(proto.GossipKeyRemove, "Remove a key that is not primary (step 3; refused until every live member holds the keyring)"),
	)
	return c
}

package cli

import (
	"encoding/json"
	"fmt"
	"net/http"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/atomicfile"
	"github.com/gpuaas/gpuaas/proto"
)

// caCmd rotates the cluster CA (admin), the way Consul and Nomad do: a
// new CA is introduced and trusted beside the old one, then activated
// (coordinators re-issue their certificates, agents renew theirs), then
// the old one is retired.
func (a *app) caCmd() *cobra.Command {
	c := &cobra.Command{Use: "ca", Short: "The cluster CA: status, bundle, rotate, activate, retire (admin)"}
	caRow := func(w *tabwriter.Writer, r proto.CARecord) {
		row(w, r.ID, r.State, r.Subject, r.NotAfter.Format(time.RFC3339), r.IntroducedAt.Format(time.RFC3339))
	}
	one := func(w *tabwriter.Writer, r proto.CARecord) {
		row(w, "ID", "STATE", "SUBJECT", "NOT AFTER", "INTRODUCED")
		caRow(w, r)
	}
	var force bool
	action := func(use, path, short string) *cobra.Command {
		cmd := &cobra.Command{
			Use:   use + " [ID]",
			Short: short,
			RunE: func(cmd *cobra.Command, args []string) error {
				if len(args) > 1 {
					return usagef("expected at most 1 argument (the CA id); got %d", len(args))
				}
				body := proto.CAActionRequest{Force: force}
				if len(args) == 1 {
					if !proto.CAIDPattern.MatchString(args[0]) {
						return usagef("%q is not a CA id (16 lower-case hex digits; gpuaasctl ca status lists them)", args[0])
					}
					body.ID = args[0]
				}
				r, err := a.call(cmd, http.MethodPost, path, nil, body, nil)
				if err != nil {
					return err
				}
				return show(a, r, one)
			},
		}
		cmd.Flags().BoolVar(&force, "force", false, "skip the check that every agent is ready")
		return cmd
	}
	c.AddCommand(&cobra.Command{
		Use:   "status",
		Short: "The CAs (staged, active, previous, retired) and each agent's bundle and certificate",
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := a.call(cmd, http.MethodGet, "/v1/operator/ca", nil, nil, nil)
			if err != nil {
				return err
			}
			return show(a, r, func(w *tabwriter.Writer, st proto.CAStatus) {
				row(w, "ID", "STATE", "SUBJECT", "NOT AFTER", "INTRODUCED")
				for _, ca := range st.CAs {
					caRow(w, ca)
				}
				row(w, "Active:", st.Active)
				row(w, "Bundle version:", st.Version)
				if len(st.Nodes) > 0 {
					row(w, "NODE", "BUNDLE", "CURRENT", "CERT CA", "SEEN")
					for _, n := range st.Nodes {
						row(w, n.NodeID, n.BundleVersion, yesNo(n.Current), n.CertCA, n.SeenAt.Format(time.RFC3339))
					}
				}
			})
		},
	}, a.caBundleCmd(), &cobra.Command{
		Use:   "rotate",
		Short: "Introduce a new CA, trusted beside the current one (it signs nothing until activated)",
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := a.call(cmd, http.MethodPost, "/v1/operator/ca/rotate", nil, struct{}{}, nil)
			if err != nil {
				return err
			}
			return show(a, r, one)
		},
	},
		action("activate", "/v1/operator/ca/activate", "Make the staged CA sign: coordinators re-issue their certificates, agents renew theirs"),
		action("retire", "/v1/operator/ca/retire", "Stop trusting the previous CA everywhere: its certificates are refused"))
	return c
}

// caBundleCmd prints the trust bundle, or writes it to --out: atomically
// and only once it was read, so a failed read (a client that no longer
// trusts the cluster's certificates) never empties the file, as a shell's
// "> file" does before the command runs.
func (a *app) caBundleCmd() *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "bundle",
		Short: "Print the CAs to trust now (PEM): the CA file of gpuaasctl and of agents (--out FILE writes it)",
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := a.call(cmd, http.MethodGet, "/v1/operator/ca", nil, nil, nil)
			if err != nil {
				return err
			}
			var st proto.CAStatus
			if err := json.Unmarshal(r.Body, &st); err != nil {
				return err
			}
			if st.BundlePEM == "" {
				return fmt.Errorf("the coordinator returned an empty CA bundle")
			}
			if out == "" {
				_, err = fmt.Fprint(a.out, st.BundlePEM)
				return err
			}
			if err := atomicfile.WriteFile(out, []byte(st.BundlePEM), 0o644); err != nil {
				return fmt.Errorf("write the CA bundle: %w", err)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "write the bundle to this file (replaced only once the bundle was read) instead of printing it")
	return cmd
}

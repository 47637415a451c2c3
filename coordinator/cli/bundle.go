package cli

import (
	"fmt"
	"net/http"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/proto"
)

func (a *app) bundleCmd() *cobra.Command {
	c := &cobra.Command{Use: "bundle", Short: "Site bootstrap, commissioning and post-deploy validation bundles (content-addressed)"}
	var name, kind string
	publish := &cobra.Command{
		Use:   "publish FILE",
		Short: "Publish a bundle (a #! script or a gzip tar with ./run); prints the sha256 ref profiles use",
		Args:  exactArgs("FILE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			data, err := os.ReadFile(args[0])
			if err != nil {
				return fmt.Errorf("read bundle: %w", err)
			}
			r, err := a.call(cmd, http.MethodPost, "/v1/bundles", map[string]string{"name": name, "kind": kind},
				RawBody{ContentType: "application/octet-stream", Data: data}, nil)
			if err != nil {
				return err
			}
			return show(a, r, func(w *tabwriter.Writer, b proto.Bundle) { bundleRow(w, true, b) })
		},
	}
	publish.Flags().StringVar(&name, "name", "", "bundle name (required)")
	publish.Flags().StringVar(&kind, "kind", string(proto.BundleSiteBootstrap), "site_bootstrap, commissioning or post_deploy_validation")
	list := &cobra.Command{
		Use:   "list",
		Short: "List published bundles",
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return listPage(a, cmd, "/v1/bundles", nil, func(w *tabwriter.Writer, l proto.List[proto.Bundle]) {
				bundleRow(w, true, proto.Bundle{})
				for _, b := range l.Items {
					bundleRow(w, false, b)
				}
			})
		},
	}
	showCmd := &cobra.Command{
		Use:   "show DIGEST",
		Short: "A bundle's record (sha256:<hex>)",
		Args:  exactArgs("DIGEST"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := a.call(cmd, http.MethodGet, "/v1/bundles/"+pathEscape(args[0]), nil, nil, nil)
			if err != nil {
				return err
			}
			return show(a, r, func(w *tabwriter.Writer, b proto.Bundle) { bundleRow(w, true, b) })
		},
	}
	c.AddCommand(publish, list, showCmd)
	return c
}

// bundleRow prints the header (and b, when it has a digest).
func bundleRow(w *tabwriter.Writer, header bool, b proto.Bundle) {
	if header {
		row(w, "DIGEST", "NAME", "KIND", "SIZE")
	}
	if b.Digest != "" {
		row(w, b.Digest, b.Name, b.Kind, b.Size)
	}
}

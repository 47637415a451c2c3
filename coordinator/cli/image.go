package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/proto"
)

// Upload streams size bytes of r to path with PUT (an image blob): no
// JSON, no buffering, no size limit.
func (c *Client) Upload(ctx context.Context, path string, r io.Reader, size int64) (*Response, error) {
	u := *c.Base
	u.Path = strings.TrimSuffix(c.Base.Path, "/") + path
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u.String(), io.NopCloser(r))
	if err != nil {
		return nil, fmt.Errorf("PUT %s: %w", path, err)
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.Token)
	res, err := c.httpClient().Do(req)
	if err != nil {
		return nil, fmt.Errorf("PUT %s: %w", u.Redacted(), err)
	}
	defer res.Body.Close()
	return answer(res, http.MethodPut, path)
}

// leaderClient is the API client aimed at the leader, for blob uploads:
// a follower stores an upload without a Raft command, so it would not be
// audited. It asks the configured coordinator (GET /v1/status) which one
// leads; without a known leader it refuses rather than upload unaudited.
func (a *app) leaderClient(cmd *cobra.Command) (*Client, error) {
	cl, err := a.client()
	if err != nil {
		return nil, err
	}
	r, err := a.call(cmd, http.MethodGet, "/v1/status", nil, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("find the leader: %w", err)
	}
	st, err := decode[proto.Status](r)
	if err != nil {
		return nil, fmt.Errorf("find the leader: %w", err)
	}
	if st.IsLeader {
		return cl, nil
	}
	if st.LeaderHTTPAddr == "" {
		return nil, proto.Errorf(proto.CodeUnavailable, "%s knows no leader right now: uploads go to the leader, where they are audited; try again after the election", cl.Base.Host)
	}
	base := *cl.Base
	base.Host = st.LeaderHTTPAddr
	leader := *cl
	leader.Base = &base
	return &leader, nil
}

// splitImage parses NAME:VERSION.
func splitImage(s string) (string, string, error) {
	name, version, ok := strings.Cut(s, ":")
	if !ok {
		return "", "", usagef("%q: name the image as NAME:VERSION", s)
	}
	if err := proto.ValidateID("image name", name); err != nil {
		return "", "", usageError{err}
	}
	if err := proto.ValidateID("image version", version); err != nil {
		return "", "", usageError{err}
	}
	return name, version, nil
}

func imagePath(name, version string) string {
	return "/v1/images/" + pathEscape(name) + "/" + pathEscape(version)
}

func imageTable(w *tabwriter.Writer, l proto.List[proto.Image]) {
	row(w, "NAME", "VERSION", "KIND", "STATE", "SIZE", "DIGEST", "CREATED")
	for _, x := range l.Items {
		row(w, x.Name, x.Version, x.Kind, x.State, x.Size, shortDigest(x.Digest), ts(x.CreatedAt))
	}
}

func shortDigest(d string) string {
	if len(d) > len("sha256:")+16 {
		return d[:len("sha256:")+16]
	}
	return d
}

func imageDetail(w *tabwriter.Writer, x proto.Image) {
	row(w, "Image:", x.Name+":"+x.Version)
	row(w, "Kind:", x.Kind)
	if ft := x.Kind.MAASFileType(); ft != "" {
		row(w, "MAAS file type:", ft)
	}
	row(w, "State:", x.State)
	if x.State == proto.ImageApproved {
		row(w, "Approved for:", x.Scope())
	}
	row(w, "Digest:", x.Digest)
	row(w, "Size:", x.Size)
	row(w, "Readiness check:", x.ReadinessCheck)
	row(w, "Marker sha256:", x.MarkerSHA256)
	row(w, "Blob:", proto.BlobPath(x.Name, x.Version))
	row(w, "Created:", ts(x.CreatedAt))
	for _, ap := range x.Approvals {
		scope := ""
		if ap.Site != "" {
			scope = " for site " + ap.Site
			if ap.Profile != "" {
				scope += " profile " + ap.Profile
			}
		}
		row(w, "Decision:", fmt.Sprintf("%s%s by %s at %s %s", ap.Action, scope, ap.By, ts(ap.At), ap.Note))
	}
	row(w, "Index:", fmt.Sprintf("create %d, modify %d", x.CreateIndex, x.ModifyIndex))
}

func (a *app) imageCmd() *cobra.Command {
	c := &cobra.Command{Use: "image", Aliases: []string{"images"}, Short: "Publish, approve, revoke and list catalog images"}
	c.AddCommand(a.imagePushCmd(), a.imageDecideCmd("approve", proto.ImageApproved), a.imageDecideCmd("revoke", proto.ImageRevoked),
		a.imageListCmd(), a.imageShowCmd())
	return c
}

// hashFile returns the digest and size of a file.
func hashFile(p string) (string, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.CopyBuffer(h, f, make([]byte, 1<<20))
	if err != nil {
		return "", 0, fmt.Errorf("hash %s: %w", p, err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), n, nil
}

func (a *app) imagePushCmd() *cobra.Command {
	var name, version, kind, check, marker string
	c := &cobra.Command{
		Use:   "push FILE",
		Short: "Hash FILE, create the catalog entry and upload the bytes (admin)",
		Long: "Computes FILE's SHA-256, creates (or confirms) the pending catalog entry NAME:VERSION with that\n" +
			"digest and size, then streams the file to the coordinator, which refuses bytes that do not\n" +
			"match. An approved version's digest never changes: push a new version instead. Approve with\n" +
			"'gpuaasctl image approve NAME:VERSION'.",
		Example: "  gpuaasctl image push guest.raw --name ubuntu-base --version 24.04.1 --kind slice_base\n" +
			"  gpuaasctl image push host.tgz --name h200-host --version 2026.04 --kind maas_tgz",
		Args: exactArgs("FILE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			body := proto.ImageBody{Kind: proto.ImageKind(kind), ReadinessCheck: check, MarkerSHA256: marker}
			if !body.Kind.Valid() {
				return usagef("--kind %q: use one of %v", kind, proto.ImageKinds)
			}
			if err := proto.ValidateID("--name", name); err != nil {
				return usageError{err}
			}
			if err := proto.ValidateID("--version", version); err != nil {
				return usageError{err}
			}
			digest, size, err := hashFile(args[0])
			if err != nil {
				return err
			}
			body.Digest, body.Size = digest, size
			fmt.Fprintf(a.errOut, "%s: %s, %d bytes\n", args[0], digest, size)
			if _, err := a.call(cmd, http.MethodPut, imagePath(name, version), nil, body, nil); err != nil {
				return err
			}
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			cl, err := a.leaderClient(cmd)
			if err != nil {
				return err
			}
			// The upload may take longer than one API call's timeout.
			r, err := cl.Upload(cmd.Context(), imagePath(name, version)+"/blob", f, size)
			if err != nil {
				return err
			}
			return show(a, r, imageDetail)
		},
	}
	f := c.Flags()
	f.StringVar(&name, "name", "", "image name (required)")
	f.StringVar(&version, "version", "", "image version (required)")
	f.StringVar(&kind, "kind", "", "slice_base, slice_cuda, maas_tgz or maas_ddgz (required)")
	f.StringVar(&check, "readiness-check", "", "image-specific readiness check run over SSH (slice images)")
	f.StringVar(&marker, "marker-sha256", "", "hex sha256 of the image's marker file, checked over SSH on every booted slice (slice images)")
	return c
}

func (a *app) imageDecideCmd(verb string, action proto.ImageState) *cobra.Command {
	var note, digest, site, profile string
	c := &cobra.Command{
		Use:   verb + " NAME:VERSION",
		Short: map[proto.ImageState]string{proto.ImageApproved: "Approve an image for use (admin)", proto.ImageRevoked: "Revoke an image (admin)"}[action],
		Args:  exactArgs("NAME:VERSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, version, err := splitImage(args[0])
			if err != nil {
				return err
			}
			r, err := a.call(cmd, http.MethodPost, imagePath(name, version)+"/"+verb, nil, proto.ImageApproveBody{Note: note, Digest: digest, Site: site, Profile: profile}, nil)
			if err != nil {
				return err
			}
			return show(a, r, imageDetail)
		},
	}
	c.Flags().StringVar(&note, "note", "", "why (recorded with the decision)")
	if action == proto.ImageApproved {
		c.Flags().StringVar(&digest, "digest", "", "refuse unless the entry has this digest (sha256:...)")
		c.Flags().StringVar(&site, "site", "", "approve for this MAAS site only (default: everywhere)")
		c.Flags().StringVar(&profile, "profile", "", "with --site: approve for this site profile only")
	}
	return c
}

func (a *app) imageListCmd() *cobra.Command {
	c := listCmd(a, "ls", "List the image catalog", "/v1/images", cursorPage("NAME:VERSION"), []filter{
		{"name", "only the versions of this image"},
		{"state", "pending, approved or revoked"},
	}, imageTable)
	c.Aliases = []string{"list"}
	return c
}

func (a *app) imageShowCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "show NAME:VERSION",
		Short: "Show an image with its approvals",
		Args:  exactArgs("NAME:VERSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, version, err := splitImage(args[0])
			if err != nil {
				return err
			}
			r, err := a.call(cmd, http.MethodGet, imagePath(name, version), nil, nil, nil)
			if err != nil {
				return err
			}
			return show(a, r, imageDetail)
		},
	}
}

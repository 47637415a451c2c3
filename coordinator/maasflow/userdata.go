package maasflow

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/gpuaas/gpuaas/proto"
)

// UserData is what the cloud-init document hands gpuaas-bootstrap.
type UserData struct {
	CoordinatorURL      string
	NodeID              string
	Token               string
	SiteBundleRef       string
	ValidationBundleRef string
	FabricMode          proto.FabricMode
	CABundle            string
	WorkflowID          string
}

// RenderUserData renders the #cloud-config document deployed with a
// node: an environment file for gpuaas-bootstrap (mode 0600: it holds the
// one-time bootstrap token), the site CA bundle (and its sha256 in the
// environment), and the bootstrap run. MAAS receives it base64-encoded.
// Every value is checked to be one line, so nothing can inject YAML.
func RenderUserData(u UserData) ([]byte, error) {
	env := []struct{ k, v string }{
		{"GPUAAS_COORDINATOR", u.CoordinatorURL},
		{"GPUAAS_NODE_ID", u.NodeID},
		{"GPUAAS_BOOTSTRAP_TOKEN", u.Token},
		{"GPUAAS_SITE_BUNDLE", u.SiteBundleRef},
		{"GPUAAS_VALIDATION_BUNDLE", u.ValidationBundleRef},
		{"GPUAAS_FABRIC_MODE", string(u.FabricMode)},
		{"GPUAAS_WORKFLOW", u.WorkflowID},
	}
	if u.CABundle != "" {
		// gpuaas-bootstrap refuses a CA file that is not the one rendered.
		sum := sha256.Sum256([]byte(caFileContent(u.CABundle)))
		env = append(env, struct{ k, v string }{"GPUAAS_SITE_CA_SHA256", hex.EncodeToString(sum[:])})
	}
	var b strings.Builder
	b.WriteString("#cloud-config\nwrite_files:\n  - path: /etc/gpuaas/bootstrap.env\n    permissions: '0600'\n    content: |\n")
	for _, e := range env {
		if strings.ContainsAny(e.v, "\r\n\"'\\") {
			return nil, fmt.Errorf("render user-data: %s holds a newline, quote or backslash", e.k)
		}
		fmt.Fprintf(&b, "      %s=%s\n", e.k, e.v)
	}
	if u.CABundle != "" {
		b.WriteString("  - path: /etc/gpuaas/site-ca.pem\n    permissions: '0644'\n    content: |\n")
		for _, line := range strings.Split(strings.TrimRight(caFileContent(u.CABundle), "\n"), "\n") {
			b.WriteString("      " + line + "\n")
		}
	}
	b.WriteString("runcmd:\n  - [/usr/local/bin/gpuaas-bootstrap, --env-file, /etc/gpuaas/bootstrap.env]\n")
	return []byte(b.String()), nil
}

// caFileContent is the CA file as cloud-init writes it (a YAML literal
// block: the lines, each ending in a newline).
func caFileContent(b string) string { return strings.TrimRight(b, "\n") + "\n" }

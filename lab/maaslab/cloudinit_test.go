package maaslab

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/bootstrap"
	"github.com/gpuaas/gpuaas/coordinator/maasflow"
	"github.com/gpuaas/gpuaas/proto/prototest"
)

// TestApplyRenderedUserData: the document the coordinator renders is
// applied as cloud-init would: the env file (0600) and the CA land under
// the host root, and the runcmd is gpuaas-bootstrap with its env file.
func TestApplyRenderedUserData(t *testing.T) {
	t.Parallel()
	ud, err := maasflow.RenderUserData(maasflow.UserData{CoordinatorURL: "http://127.0.0.1:7300", NodeID: "j22u15",
		Token: "gpb_" + strings.Repeat("ab", 32), CABundle: prototest.TestCA, WorkflowID: "onboard.lab.j22u15", FabricMode: "ib"})
	require.NoError(t, err)
	cc, err := ParseCloudConfig(ud)
	require.NoError(t, err)
	root := t.TempDir()
	require.NoError(t, cc.WriteFilesUnder(root))
	env, err := os.ReadFile(filepath.Join(root, "etc/gpuaas/bootstrap.env"))
	require.NoError(t, err)
	assert.Contains(t, string(env), "GPUAAS_NODE_ID=j22u15\n")
	assert.Contains(t, string(env), "GPUAAS_SITE_CA_SHA256=")
	st, err := os.Stat(filepath.Join(root, "etc/gpuaas/bootstrap.env"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm(), "the token file is private")
	ca, err := os.ReadFile(filepath.Join(root, "etc/gpuaas/site-ca.pem"))
	require.NoError(t, err)
	assert.Equal(t, strings.TrimRight(prototest.TestCA, "\n")+"\n", string(ca))
	in, err := bootstrap.ParseEnv(string(env))
	require.NoError(t, err)
	assert.NoError(t, bootstrap.VerifyCA(ca, in.CASHA256), "gpuaas-bootstrap accepts the CA file cloud-init wrote")
	assert.Equal(t, [][]string{{"/usr/local/bin/gpuaas-bootstrap", "--env-file", "/etc/gpuaas/bootstrap.env"}}, cc.RunCmd)
}

func TestParseCloudConfigRefuses(t *testing.T) {
	t.Parallel()
	for name, doc := range map[string]string{
		"not cloud-config": "#!/bin/sh\necho hi\n",
		"relative path":    "#cloud-config\nwrite_files:\n  - path: etc/x\n    content: y\n",
		"traversal":        "#cloud-config\nwrite_files:\n  - path: /etc/../../x\n    content: y\n",
		"bad permissions":  "#cloud-config\nwrite_files:\n  - path: /etc/x\n    permissions: 'rw'\n    content: y\n",
		"empty runcmd":     "#cloud-config\nruncmd:\n  - []\n",
	} {
		_, err := ParseCloudConfig([]byte(doc))
		assert.Error(t, err, name)
	}
}

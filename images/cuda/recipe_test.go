package cuda

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/gpuaas/gpuaas/lab/guestgpu"
)

func TestRecipesValidate(t *testing.T) {
	t.Parallel()
	require.NoError(t, BaseRecipe().Validate())
	require.NoError(t, CUDARecipe().Validate())
	for name, tc := range map[string]struct {
		mut  func(r *Recipe)
		want string
	}{
		"unpinned package":   {func(r *Recipe) { r.Packages[0].Version = "" }, "not pinned"},
		"wildcard version":   {func(r *Recipe) { r.Packages[0].Version = "570.*" }, "not pinned"},
		"duplicate package":  {func(r *Recipe) { r.Packages = append(r.Packages, r.Packages[0]) }, "listed twice"},
		"package injection":  {func(r *Recipe) { r.Packages[0].Name = "nvidia; rm -rf /" }, "package name"},
		"http repository":    {func(r *Recipe) { r.Repo.URL = "http://developer.download.nvidia.com/x/" }, "https"},
		"repo without slash": {func(r *Recipe) { r.Repo.URL = "https://developer.download.nvidia.com/x" }, "ending in /"},
		"unpinned key":       {func(r *Recipe) { r.Repo.KeyFinger = "" }, "fingerprint"},
		"http base":          {func(r *Recipe) { r.Base.Server = "http://cloud-images.ubuntu.com/releases" }, "https"},
		"base key":           {func(r *Recipe) { r.Base.KeyFinger = "d2eb" }, "malformed"},
		"no repo":            {func(r *Recipe) { r.Repo = nil }, "needs NVIDIA's repository"},
		"wrong check":        {func(r *Recipe) { r.ReadinessCheck = "" }, `readiness check is "cuda"`},
		"kind without layer": {func(r *Recipe) { r.Layers = r.Layers[:1] }, "cuda layer makes"},
		"contract first":     {func(r *Recipe) { r.Layers = []string{LayerCUDA} }, "first layer"},
		"bad service":        {func(r *Recipe) { r.Services = []string{"nvidia-persistenced; reboot"} }, "service"},
		"tiny disk":          {func(r *Recipe) { r.SizeGiB = 1 }, "GiB"},
	} {
		r := CUDARecipe()
		tc.mut(&r)
		assert.ErrorContains(t, r.Validate(), tc.want, name)
	}
	b := BaseRecipe()
	b.Packages = []Package{{Name: "gcc-13", Version: "13.2.0-23ubuntu4"}}
	assert.ErrorContains(t, b.Validate(), "a base image takes no repository and no packages")
	b = BaseRecipe()
	b.Kind = KindCUDA
	assert.ErrorContains(t, b.Validate(), "cuda layer makes")
}

// TestCUDAPinned: every CUDA piece is pinned to one exact version, held,
// and installed by exactly that version.
func TestCUDAPinned(t *testing.T) {
	t.Parallel()
	r := CUDARecipe()
	names := map[string]string{}
	for _, p := range r.Packages {
		names[p.Name] = p.Version
		assert.Regexp(t, `^[0-9][0-9.]+-[0-9a-z]+$`, p.Version, p.Name)
	}
	for _, want := range []string{"nvidia-driver-570-open", "nvidia-dkms-570-open", "nvidia-fabricmanager-570", "nvidia-compute-utils-570", "cuda-toolkit-12-8"} {
		assert.Contains(t, names, want, "the CUDA layer installs %s", want)
	}
	for _, want := range []string{"crun", "nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools", "libnvidia-container1"} {
		assert.Contains(t, names, want, "launchables need %s", want)
	}
	for n, v := range names {
		if strings.Contains(n, "-container") {
			assert.Equal(t, ToolkitVersion, v, "the container toolkit's packages are on one version")
			continue
		}
		if strings.HasPrefix(n, "nvidia-") || strings.HasPrefix(n, "libnvidia-") {
			assert.True(t, strings.HasPrefix(v, DriverVersion+"-"), "%s %s is on driver %s", n, v, DriverVersion)
		}
	}
	assert.Equal(t, guestgpu.DriverVersion, DriverVersion, "the lab's simulated nvidia-smi reports the pinned driver")
	assert.Equal(t, "12-8", strings.ReplaceAll(CUDAVersion[:4], ".", "-"))

	prefs := r.AptPreferences()
	blocks := strings.Split(strings.TrimSpace(prefs), "\n\n")[1:]
	require.Len(t, blocks, len(r.Packages))
	for i, p := range r.Packages {
		assert.Equal(t, "Package: "+p.Name+"\nPin: version "+p.Version+"\nPin-Priority: 1001", blocks[i])
	}
	s := r.Script()
	assert.Contains(t, s, "apt-get install -y --no-install-recommends "+strings.Join(r.PackageArgs(), " ")+"\n")
	for _, a := range r.PackageArgs() {
		assert.Regexp(t, `^[a-z0-9.+-]+=[0-9][A-Za-z0-9.+~-]*$`, a)
	}
	assert.Contains(t, s, "apt-mark hold nvidia-driver-570-open ")
	assert.Contains(t, s, "systemctl enable nvidia-persistenced.service nvidia-fabricmanager.service gpuaas-nvidia-cdi.service\n")
	assert.Contains(t, s, "test -x /usr/bin/nvidia-container-runtime-hook\n")
	assert.Contains(t, s, "cat > /etc/systemd/system/gpuaas-nvidia-cdi.service <<'UNIT'\n"+CDIUnit()+"UNIT\n")
	assert.Contains(t, CDIUnit(), "ExecStart=/usr/bin/nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml\n")
	assert.Contains(t, s, "crun="+CrunVersion+" ")
	assert.Contains(t, s, `if [ "$finger" != "EB693B3035CD5710E231E123A4B469963BF863CC" ]`)
	assert.Contains(t, s, "curl -fsSL --retry 3 https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/3bf863cc.pub")
	assert.Contains(t, s, `dkms status -k "$kver" | grep -E '^nvidia/570.124.06.*: installed'`)
	assert.Equal(t, "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/ /\n", r.AptSource())
}

// cudaPiece matches anything of the CUDA layer or a build toolchain.
var cudaPiece = regexp.MustCompile(`(?i)nvidia|cuda|fabricmanager|nscq|dkms|gcc|build-essential|toolkit|linux-headers|nvcc`)

// TestBaseCarriesNoCUDA: the base image's manifest, script and files list
// no CUDA piece and no toolchain; the CUDA image is the base plus them.
func TestBaseCarriesNoCUDA(t *testing.T) {
	t.Parallel()
	b := BaseRecipe()
	m := b.Manifest()
	assert.Empty(t, m.Packages)
	assert.Empty(t, m.Repositories)
	assert.Empty(t, m.Services)
	assert.Equal(t, []string{LayerContract}, m.Layers)
	assert.Equal(t, KindBase, m.Kind)
	assert.Empty(t, m.ReadinessCheck)
	j, err := json.Marshal(m)
	require.NoError(t, err)
	for what, text := range map[string]string{"manifest": string(j), "script": b.Script(), "cloud-config": b.CloudConfig(),
		"apt preferences": b.AptPreferences(), "apt source": b.AptSource()} {
		assert.Empty(t, cudaPiece.FindAllString(text, -1), "base %s", what)
	}

	c := CUDARecipe().Manifest()
	assert.Equal(t, append(m.Layers, LayerCUDA), c.Layers)
	assert.Subset(t, c.Files, m.Files, "the CUDA image keeps the base contract")
	assert.Equal(t, m.Base, c.Base, "derived from the same base")
	assert.True(t, strings.HasPrefix(CUDARecipe().Script(), strings.Replace(b.Script(), b.Name+" "+b.Version, CUDARecipe().Name+" "+CUDARecipe().Version, 1)),
		"the CUDA script starts with the base layer")
	assert.NotEmpty(t, cudaPiece.FindAllString(string(mustJSON(t, c)), -1))
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

// TestCloudConfig: the contract cloud-init config parses as YAML and says
// what the readiness gate relies on.
func TestCloudConfig(t *testing.T) {
	t.Parallel()
	var cfg struct {
		Datasources []string   `yaml:"datasource_list"`
		DisableRoot *bool      `yaml:"disable_root"`
		SSHPwauth   *bool      `yaml:"ssh_pwauth"`
		Bootcmd     [][]string `yaml:"bootcmd"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(CUDARecipe().CloudConfig()), &cfg))
	assert.Equal(t, []string{"NoCloud", "None"}, cfg.Datasources)
	require.NotNil(t, cfg.DisableRoot)
	assert.False(t, *cfg.DisableRoot, "root keeps the seed's keys: the agent logs in as root")
	require.NotNil(t, cfg.SSHPwauth)
	assert.False(t, *cfg.SSHPwauth)
	require.Len(t, cfg.Bootcmd, 1)
	assert.Equal(t, []string{"sh", "-c", "install -d -m 0755 /run/gpuaas && cloud-init query instance_id > /run/gpuaas/instance-id"}, cfg.Bootcmd[0])
	s := BaseRecipe().Script()
	assert.Contains(t, s, "ln -sfn /boot/efi /disk\n", "the marker is /disk/gpuaas/marker as in the lab guest")
	assert.Contains(t, s, "install -d -m 0755 /boot/efi/gpuaas\n")
}

func TestBaseURLs(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "https://cloud-images.ubuntu.com/releases/noble/release-20240423/ubuntu-24.04-server-cloudimg-amd64.img", UbuntuBase.URL())
	assert.Equal(t, "https://cloud-images.ubuntu.com/releases/noble/release-20240423/SHA256SUMS", UbuntuBase.SumsURL())
}

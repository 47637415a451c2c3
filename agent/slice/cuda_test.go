package slice

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// Real `nvidia-smi --query-gpu=name,pci.bus_id,uuid,driver_version,memory.total
// --format=csv,noheader` output of HGX H200 (SXM 141GB) guests, as the cuda
// check's command prints it (exit status line appended).
const (
	smiH200a = "NVIDIA H200, 00000000:18:00.0, GPU-3b5c9e1a-7f42-4d8e-b1c6-5a9e2d7f0c41, 570.124.06, 143771 MiB\n"
	smiH200b = "NVIDIA H200, 00000000:2A:00.0, GPU-c81f04d2-96ab-43e7-8d25-f0b7a6c39e58, 570.124.06, 143771 MiB\n"
	smiH100  = "NVIDIA H100 80GB HBM3, 00000000:18:00.0, GPU-0e7d1c55-2b8a-4f19-a6c3-9d4e7f215b80, 570.124.06, 81559 MiB\n"
	smiOK    = cudaExitTag + "0\n"
)

func TestVerifyCUDA(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		out  string
		gpus int
		want string // evidence substring, or error substring when err
		err  bool
	}{
		{name: "one H200", out: smiH200a + smiOK, gpus: 1,
			want: "ssh: nvidia-smi lists 1 GPUs as the plan says, driver 570.124.06: NVIDIA H200 00000000:18:00.0 GPU-3b5c9e1a-7f42-4d8e-b1c6-5a9e2d7f0c41 143771 MiB"},
		{name: "two H200", out: smiH200a + smiH200b + smiOK, gpus: 2,
			want: "143771 MiB; NVIDIA H200 00000000:2A:00.0 GPU-c81f04d2-96ab-43e7-8d25-f0b7a6c39e58"},
		{name: "H200 NVL", out: strings.Replace(smiH200a, "NVIDIA H200", "NVIDIA H200 NVL", 1) + smiOK, gpus: 1, want: "NVIDIA H200 NVL 00000000:18:00.0"},
		{name: "one GPU missing", out: smiH200a + smiOK, gpus: 2, err: true, want: "nvidia-smi lists 1 GPUs, the slice has 2"},
		{name: "one GPU too many", out: smiH200a + smiH200b + smiOK, gpus: 1, err: true, want: "lists 2 GPUs, the slice has 1"},
		{name: "wrong model", out: smiH100 + smiOK, gpus: 1, err: true, want: `is a "NVIDIA H100 80GB HBM3", the slice's GPUs are NVIDIA H200`},
		{name: "H2000 is not an H200", out: strings.Replace(smiH200a, "NVIDIA H200", "NVIDIA H2000", 1) + smiOK, gpus: 1, err: true, want: "is a \"NVIDIA H2000\""},
		{name: "no devices", out: "No devices were found\n" + cudaExitTag + "6\n", gpus: 1, err: true,
			want: "nvidia-smi exited 6: No devices were found (the slice has 1 GPUs)"},
		{name: "driver not loaded", out: "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.\n\n" + cudaExitTag + "9\n",
			gpus: 1, err: true, want: "nvidia-smi exited 9: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"},
		{name: "no nvidia-smi (base image)", out: "sh: nvidia-smi: command not found\n" + cudaExitTag + "127\n", gpus: 1, err: true, want: "exited 127"},
		{name: "memory N/A", out: strings.Replace(smiH200a, "143771 MiB", "[N/A]", 1) + smiOK, gpus: 1, err: true, want: `memory.total is "[N/A]"`},
		{name: "uuid unknown error", out: strings.Replace(smiH200a, "GPU-3b5c9e1a-7f42-4d8e-b1c6-5a9e2d7f0c41", "[Unknown Error]", 1) + smiOK, gpus: 1, err: true, want: `uuid is "[Unknown Error]"`},
		{name: "name ERR!", out: strings.Replace(smiH200a, "NVIDIA H200", "ERR!", 1) + smiOK, gpus: 1, err: true, want: `name is "ERR!"`},
		{name: "no driver version", out: strings.Replace(smiH200a, "570.124.06", "", 1) + smiOK, gpus: 1, err: true, want: `driver_version is ""`},
		{name: "bogus driver version", out: strings.Replace(smiH200a, "570.124.06", "latest", 1) + smiOK, gpus: 1, err: true, want: `driver version "latest"`},
		{name: "mixed drivers", out: smiH200a + strings.Replace(smiH200b, "570.124.06", "565.57.01", 1) + smiOK, gpus: 2, err: true, want: "driver 565.57.01, GPU 0 has 570.124.06"},
		{name: "same GPU twice", out: smiH200a + smiH200a + smiOK, gpus: 2, err: true, want: "twice"},
		{name: "short row", out: "NVIDIA H200, 00000000:18:00.0\n" + smiOK, gpus: 1, err: true, want: "has 2 fields, want 5"},
		{name: "no exit status", out: smiH200a, gpus: 1, err: true, want: "no exit status"},
		{name: "garbled exit status", out: smiH200a + cudaExitTag + "x\n", gpus: 1, err: true, want: "exit status \"x\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev, err := cudaCheck.Verify(tc.out, expect{GPUs: tc.gpus})
			if tc.err {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.want)
				return
			}
			require.NoError(t, err)
			assert.Contains(t, ev, tc.want)
		})
	}
}

func TestCUDACheckCommand(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "nvidia-smi --query-gpu=name,pci.bus_id,uuid,driver_version,memory.total --format=csv,noheader 2>&1; echo "+cudaExitTag+"$?", cudaCheck.Command)
	checks, err := checksFor("cuda")
	require.NoError(t, err)
	require.Len(t, checks, len(baseChecks)+1)
	assert.Equal(t, "cuda", checks[len(checks)-1].Name, "the cuda check runs after the base checks")
}

// TestProvisionCUDAReadiness runs a CUDA image's provision through the
// fakes: the evidence names both GPUs; a guest listing one GPU short
// fails at ssh_ready with both slots touched.
func TestProvisionCUDAReadiness(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		answer string
		errMsg string
	}{
		"both GPUs":     {answer: smiH200a + smiH200b + smiOK},
		"one GPU short": {answer: smiH200a + smiOK, errMsg: "readiness check cuda: nvidia-smi lists 1 GPUs, the slice has 2"},
		"no devices":    {answer: "No devices were found\n" + cudaExitTag + "6\n", errMsg: "readiness check cuda: nvidia-smi exited 6: No devices were found"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.guest.answers[cudaCheck.Command] = tc.answer
			req := testRequest(t)
			req.Image.Kind, req.Image.ReadinessCheck = "slice_cuda", "cuda"
			res, err := e.rt.Provision(context.Background(), req, &recorder{})
			if tc.errMsg == "" {
				require.NoError(t, err)
				ev := strings.Join(res.Slots[0].Evidence, "\n")
				assert.Contains(t, ev, "nvidia-smi lists 2 GPUs as the plan says, driver 570.124.06")
				assert.Contains(t, ev, "00000000:2A:00.0")
				return
			}
			require.Error(t, err)
			assert.ErrorContains(t, err, tc.errMsg)
			assert.Equal(t, proto.StageSSHReady, res.FailedStage)
			assert.Equal(t, []string{"j22u15-s0", "j22u15-s1"}, res.TouchedSlots)
			assert.Empty(t, e.hv.doms, "VM destroyed and undefined")
		})
	}
}

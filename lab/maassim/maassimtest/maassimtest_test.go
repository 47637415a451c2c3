package maassimtest_test

import (
	"testing"
	"time"

	"github.com/canonical/gomaasclient/client"
	"github.com/canonical/gomaasclient/entity"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/lab/maassim"
	"github.com/gpuaas/gpuaas/lab/maassim/maassimtest"
)

func TestStartManualAndScaled(t *testing.T) {
	t.Parallel()
	for _, clock := range []maassim.Clock{nil, maassim.NewScaledClock(maassimtest.Epoch, 100000)} {
		sim := maassimtest.Start(t, maassim.Options{Clock: clock})
		c, err := client.GetClient(sim.URL, sim.APIKey, "2.0")
		require.NoError(t, err)
		id, err := sim.Enlist(maassim.Enlistment{MACs: []string{"52:54:00:00:80:01"}})
		require.NoError(t, err)
		_, err = c.Machine.Commission(id, &entity.MachineCommissionParams{})
		require.NoError(t, err)
		if sim.Clock != nil {
			sim.AdvanceUntil(t, id, maassim.StatusReady, time.Minute, time.Hour)
			require.Equal(t, maassimtest.Epoch.Add(8*time.Minute), sim.Clock.Now())
		} else {
			sim.WaitStatus(t, id, maassim.StatusReady, 5*time.Second)
		}
	}
}

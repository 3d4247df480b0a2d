import time, sys
t00=time.perf_counter()
sys.path.insert(0,'/work/main')
import grainlike as grain
class Identity(grain.MapTransform):
    def map(self, x): return x
def mk():
    return grain.DataLoader(data_source=grain.RangeDataSource(0,10**6,1), sampler=grain.IndexSampler(10**6, grain.NoSharding(), shuffle=True, num_epochs=1, seed=0), operations=[Identity(), grain.Batch(128)], worker_count=2)
l=mk()
for i in range(3):
    t=time.perf_counter(); it=iter(l); next(it); print('first', time.perf_counter()-t); it.close()
l0 = grain.DataLoader(data_source=grain.RangeDataSource(0,10**6,1), sampler=grain.IndexSampler(10**6, grain.NoSharding(), shuffle=True, num_epochs=1, seed=0), operations=[Identity(), grain.Batch(128)], worker_count=0)
t=time.perf_counter(); it=iter(l0); next(it); print('W0 first', time.perf_counter()-t)

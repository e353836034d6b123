// Session s4 microbenchmark: linear read of 512 KiB (L2) with zmm loads; bytes per TSC tick.
#include <immintrin.h>
#include <cstdio>
#include <cstdlib>
#include <x86intrin.h>
#include <algorithm>
int main(){ const size_t n = 512<<10; float* a=(float*)aligned_alloc(4096,n); for(size_t i=0;i<n/4;i++) a[i]=1;
 double best=1e30; __m512 s0=_mm512_setzero_ps(),s1=s0,s2=s0,s3=s0;
 for(int r=0;r<50;r++){ unsigned long long t0=__rdtsc(); for(size_t i=0;i<n/4;i+=64){ s0=_mm512_add_ps(s0,_mm512_load_ps(a+i)); s1=_mm512_add_ps(s1,_mm512_load_ps(a+i+16)); s2=_mm512_add_ps(s2,_mm512_load_ps(a+i+32)); s3=_mm512_add_ps(s3,_mm512_load_ps(a+i+48)); } unsigned long long t1=__rdtsc(); best=std::min(best,(double)(t1-t0)); }
 printf("L2 linear read: %.1f B/tick = %.1f B/cycle (1.39 cyc/tick) %f\n", n/best, n/best/1.39, _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0,s1),_mm512_add_ps(s2,s3)))); }

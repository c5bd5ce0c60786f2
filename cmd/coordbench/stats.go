package main

import (
	"slices"
	"time"
)

// percentile is the nearest-rank p-th percentile (0 < p <= 100) of sorted
// samples; 0 when there are none.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(p/100*float64(len(sorted))+0.999999999) - 1
	return sorted[min(max(rank, 0), len(sorted)-1)]
}

// spread is the median, minimum and maximum of repeated measurements.
type spread struct{ med, lo, hi float64 }

func spreadOf(xs []float64) spread {
	if len(xs) == 0 {
		return spread{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return spread{med: med, lo: s[0], hi: s[n-1]}
}

module snapsvc-ci/measure

go 1.22.0

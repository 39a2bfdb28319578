module github.com/rationhq/ration

go 1.26.8

require pgregory.net/rapid v1.3.0

require go.uber.org/goleak v1.3.0

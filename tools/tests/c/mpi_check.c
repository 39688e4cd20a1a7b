/* An MPI job whose every result is checked, for two ranks in two namespaces (over our
 * libibverbs with Open MPI's UCX pml, or over its TCP BTL as the baseline):
 *   - ping-pong from 8 B to 4 MiB: half round trip and bandwidth, each message's bytes
 *     checked on both sides;
 *   - MPI_Allreduce (sum) of 1 Mi doubles, checked against the closed form;
 *   - MPI_Alltoall of 256 KiB per peer, every block checked;
 *   - one 64 MiB point-to-point transfer, checked byte by byte.
 * Usage: mpi_check [SCALE]   (SCALE divides the ping-pong iterations; 1 by default)
 * Prints one line per result and, last, "mpi_check: verified" with exit status 0 only if
 * every check passed; a failed check prints what differed and aborts with status 1. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size;

static void fail(const char *what, long at, long got, long want)
{
	fprintf(stderr, "mpi_check: rank %d: %s wrong at %ld: %ld, not %ld\n", rank, what,
		at, got, want);
	MPI_Abort(MPI_COMM_WORLD, 1);
}

/* The byte at offset i of message n: different for every message and position. */
static unsigned char pattern(uint64_t n, size_t i)
{
	uint64_t x = (n + 1) * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
	return (unsigned char)(x >> 56);
}

static void fill(unsigned char *buf, size_t len, uint64_t n)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = pattern(n, i);
}

static void check(const char *what, const unsigned char *buf, size_t len, uint64_t n)
{
	for (size_t i = 0; i < len; i++)
		if (buf[i] != pattern(n, i))
			fail(what, (long)i, buf[i], pattern(n, i));
}

static void *must_alloc(size_t len)
{
	void *p = malloc(len ? len : 1);
	if (!p) {
		fprintf(stderr, "mpi_check: out of memory for %zu bytes\n", len);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	return p;
}

/* Rank 0 sends message n, rank 1 checks it and answers with message n + 1, which rank 0
 * checks: every byte crosses the wire both ways and is looked at. */
static void pingpong(int iters)
{
	static const size_t sizes[] = { 8, 64, 512, 4096, 32768, 262144, 1048576, 4194304 };
	unsigned char *buf = must_alloc(4194304);
	for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		size_t len = sizes[s];
		int n = len >= 1048576 ? (iters + 49) / 50 : len >= 32768 ? (iters + 9) / 10 : iters;
		if (n < 2)
			n = 2;
		MPI_Barrier(MPI_COMM_WORLD);
		double start = MPI_Wtime();
		for (int i = 0; i < n; i++) {
			uint64_t id = ((uint64_t)s << 32) | (uint64_t)(2 * i);
			if (rank == 0) {
				fill(buf, len, id);
				MPI_Send(buf, (int)len, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
				MPI_Recv(buf, (int)len, MPI_BYTE, 1, 0, MPI_COMM_WORLD,
					 MPI_STATUS_IGNORE);
				check("ping-pong reply", buf, len, id + 1);
			} else if (rank == 1) {
				MPI_Recv(buf, (int)len, MPI_BYTE, 0, 0, MPI_COMM_WORLD,
					 MPI_STATUS_IGNORE);
				check("ping-pong message", buf, len, id);
				fill(buf, len, id + 1);
				MPI_Send(buf, (int)len, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
			}
		}
		double elapsed = MPI_Wtime() - start;
		if (rank == 0) {
			double half_rtt = elapsed / n / 2;
			printf("pingpong %8zu B  %5d iters  %10.2f us  %9.2f MB/s\n", len, n,
			       half_rtt * 1e6, len / half_rtt / 1e6);
			fflush(stdout);
		}
	}
	free(buf);
}

/* Rank r contributes r + i + 1 at i: the sum at i is size * (i + 1) + size * (size - 1) / 2. */
static void allreduce(void)
{
	const int count = 1 << 20;
	double *in = must_alloc(count * sizeof(double));
	double *out = must_alloc(count * sizeof(double));
	for (int i = 0; i < count; i++)
		in[i] = (double)(rank + i + 1);
	MPI_Barrier(MPI_COMM_WORLD);
	double start = MPI_Wtime();
	MPI_Allreduce(in, out, count, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
	double elapsed = MPI_Wtime() - start;
	for (int i = 0; i < count; i++) {
		double want = (double)size * (i + 1) + (double)size * (size - 1) / 2;
		if (out[i] != want)
			fail("allreduce sum", i, (long)out[i], (long)want);
	}
	if (rank == 0)
		printf("allreduce %d doubles (sum)  %10.2f ms  verified\n", count, elapsed * 1e3);
	free(in);
	free(out);
}

/* Block p of rank r's send buffer is message (r, p); rank p's block r must be it. */
static void alltoall(void)
{
	const size_t block = 262144;
	unsigned char *send = must_alloc(block * size);
	unsigned char *recv = must_alloc(block * size);
	for (int p = 0; p < size; p++)
		fill(send + block * p, block, (uint64_t)(1000 + rank * 64 + p));
	memset(recv, 0, block * size);
	MPI_Barrier(MPI_COMM_WORLD);
	double start = MPI_Wtime();
	MPI_Alltoall(send, (int)block, MPI_BYTE, recv, (int)block, MPI_BYTE, MPI_COMM_WORLD);
	double elapsed = MPI_Wtime() - start;
	for (int p = 0; p < size; p++)
		check("alltoall block", recv + block * p, block, (uint64_t)(1000 + p * 64 + rank));
	if (rank == 0)
		printf("alltoall %zu B per rank pair  %10.2f ms  verified\n", block, elapsed * 1e3);
	free(send);
	free(recv);
}

/* 64 MiB from rank 0 to rank 1 in one message, then a one-byte answer. */
static void bulk(void)
{
	const size_t len = 64u << 20;
	unsigned char *buf = must_alloc(len);
	unsigned char ack = 0;
	if (rank == 0)
		fill(buf, len, 7777);
	else
		memset(buf, 0, len);
	MPI_Barrier(MPI_COMM_WORLD);
	double start = MPI_Wtime();
	if (rank == 0) {
		MPI_Send(buf, (int)len, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
		MPI_Recv(&ack, 1, MPI_BYTE, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
	} else if (rank == 1) {
		MPI_Recv(buf, (int)len, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		check("64 MiB transfer", buf, len, 7777);
		ack = 1;
		MPI_Send(&ack, 1, MPI_BYTE, 0, 2, MPI_COMM_WORLD);
	}
	double elapsed = MPI_Wtime() - start;
	if (rank == 0) {
		if (ack != 1)
			fail("64 MiB transfer acknowledgement", 0, ack, 1);
		printf("transfer 64 MiB  %10.2f ms  %9.2f MB/s  verified\n", elapsed * 1e3,
		       len / elapsed / 1e6);
	}
	free(buf);
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	int scale = argc > 1 ? atoi(argv[1]) : 1;
	if (scale < 1)
		scale = 1;
	if (size < 2) {
		fprintf(stderr, "mpi_check: needs at least 2 ranks, has %d\n", size);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	char host[MPI_MAX_PROCESSOR_NAME];
	int host_len;
	MPI_Get_processor_name(host, &host_len);
	printf("rank %d of %d on %s\n", rank, size, host);
	fflush(stdout);
	MPI_Barrier(MPI_COMM_WORLD);
	pingpong(1000 / scale);
	allreduce();
	alltoall();
	bulk();
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 0)
		printf("mpi_check: verified\n");
	MPI_Finalize();
	return 0;
}

/*
tests/emu/nccl.h — the NCCL calls gridgpt makes, emulated over MPI (tests only).

Every call runs at once, on the stream it is given, as cuda_runtime.h runs a stream's work:
under EMU_DEFER_STREAMS=1 a collective queued on a created stream waits in its queue until
something waits for it. Buffers must lie inside one emulated device allocation (NCCL reads
device memory only), as cuda_runtime.h checks.

Communicators. An ncclUniqueId carries the world rank of the process that made it and a
serial number (how many ids that process has made). ncclCommInitRank(comm, n, id, r) must
build an MPI communicator of exactly the n callers holding that id, ordered by r, without
involving any other process (NCCL's init is collective over the clique only; parallel.h's
embedding group leaves some ranks out). So the members meet at the id's maker over
MPI_COMM_WORLD, point to point, with the serial number as tag: each sends (r, world rank)
to the maker, the maker (always member r = 0 here, as NCCL's examples and parallel.h do,
but not required: it only has to be a member) answers with the world ranks in order of r,
and all call MPI_Comm_create_group, which is collective over the members only. Tags start
at EMU_NCCL_TAG so that they stay clear of anything else sent on MPI_COMM_WORLD.

Reductions: ncclBfloat16 and ncclFloat16 are summed (or max-ed) in fp32 and rounded once to
their type (real NCCL rounds after each ring step; either is within one rounding of the
exact sum for the group sizes tested). ncclFloat and ncclDouble reduce in their own type.
ncclReduce and ncclReduceScatter add the ranks' values in rank order, element by element,
so that a reduce-scatter and the reduces to each owner of the same data (parallel.h's
bucketed gradient reduction) give the same bits for any group size (real NCCL's orders
differ between the two: there they agree to rounding).
Grouped ncclSend/ncclRecv between ncclGroupStart and ncclGroupEnd are posted together as
MPI_Isend/MPI_Irecv at ncclGroupEnd and waited for with MPI_Waitall, so neighbours that
send to each other in one group do not deadlock; the group runs on its stream as a
collective does (its calls must share one stream here). Outside a group a send or receive
is a group of its own.
What it cannot show: real NCCL transport, its ring/tree rounding order, overlap with
kernels on streams.
*/
#pragma once
#include <mpi.h>
#include <stdint.h>
#include <string.h>
#include <vector>
#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime.h"

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
} ncclResult_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3 } ncclRedOp_t;
typedef enum {
    ncclInt32 = 2,
    ncclFloat16 = 6, ncclHalf = 6,
    ncclFloat32 = 7, ncclFloat = 7,
    ncclFloat64 = 8, ncclDouble = 8,
    ncclBfloat16 = 9,
} ncclDataType_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

struct EmuNcclComm {
    MPI_Comm mpi;
    int size, rank;
};
typedef EmuNcclComm* ncclComm_t;

#define EMU_NCCL_TAG 30000

struct EmuNcclOp {
    bool send;
    void* buf;
    size_t bytes;
    int peer;
    ncclComm_t comm;
    cudaStream_t stream;
};
inline int emu_nccl_group_depth = 0;
inline std::vector<EmuNcclOp> emu_nccl_group_ops;
inline int emu_nccl_ids_made = 0;

static const char* ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error (emulated: an MPI call failed)";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    }
    return "unknown result code";
}

static size_t emu_nccl_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt32: return 4;
    case ncclFloat: return 4;
    case ncclDouble: return 8;
    case ncclBfloat16: return 2;
    case ncclFloat16: return 2;
    }
    return 0;
}

static ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
    int world_rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    int tag_ub = 32767;  // the least MPI_TAG_UB the standard allows
    if (EMU_NCCL_TAG + emu_nccl_ids_made > tag_ub) return ncclInternalError;
    memset(id, 0, sizeof(*id));
    int fields[2] = {world_rank, emu_nccl_ids_made++};
    memcpy(id->internal, fields, sizeof(fields));
    return ncclSuccess;
}

static ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
    int fields[2], world_rank;
    memcpy(fields, id.internal, sizeof(fields));
    int maker = fields[0], tag = EMU_NCCL_TAG + fields[1];
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    if (nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    std::vector<int> members(nranks, -1);
    if (world_rank == maker) {
        members[rank] = world_rank;
        for (int i = 1; i < nranks; i++) {
            int msg[2];
            if (MPI_Recv(msg, 2, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE) != MPI_SUCCESS) return ncclSystemError;
            if (msg[0] < 0 || msg[0] >= nranks || members[msg[0]] != -1) return ncclInvalidUsage;  // two callers with one rank
            members[msg[0]] = msg[1];
        }
        for (int i = 0; i < nranks; i++)
            if (members[i] != world_rank && MPI_Send(members.data(), nranks, MPI_INT, members[i], tag, MPI_COMM_WORLD) != MPI_SUCCESS)
                return ncclSystemError;
    } else {
        int msg[2] = {rank, world_rank};
        if (MPI_Send(msg, 2, MPI_INT, maker, tag, MPI_COMM_WORLD) != MPI_SUCCESS) return ncclSystemError;
        if (MPI_Recv(members.data(), nranks, MPI_INT, maker, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE) != MPI_SUCCESS) return ncclSystemError;
    }
    MPI_Group world_group, group;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    MPI_Group_incl(world_group, nranks, members.data(), &group);
    EmuNcclComm* c = new EmuNcclComm;
    int err = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &c->mpi);
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    if (err != MPI_SUCCESS) return delete c, ncclSystemError;
    MPI_Comm_size(c->mpi, &c->size);
    MPI_Comm_rank(c->mpi, &c->rank);
    if (c->size != nranks || c->rank != rank) return delete c, ncclInternalError;
    *comm = c;
    return ncclSuccess;
}

static ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (comm == NULL) return ncclInvalidArgument;
    cudaDeviceSynchronize();   // nothing held back may run on a freed communicator
    MPI_Comm_free(&comm->mpi);
    delete comm;
    return ncclSuccess;
}
// the watchdog's call on a job that hangs: the process exits right after, so nothing to free
// (freeing an MPI communicator here could block on the hung peers)
static ncclResult_t ncclCommAbort(ncclComm_t comm) { return comm == NULL ? ncclInvalidArgument : ncclSuccess; }

static bool emu_nccl_on_device(const void* p, size_t count, ncclDataType_t t) {
    return count == 0 || emu_is_device_range(p, count * emu_nccl_size(t));
}

// element i of a bf16 or fp16 buffer as a float, and back (rounded to nearest even)
static float emu_nccl_widen(const void* buf, ncclDataType_t t, size_t i) {
    return t == ncclBfloat16 ? __bfloat162float(((const __nv_bfloat16*)buf)[i]) : __half2float(((const __half*)buf)[i]);
}
static void emu_nccl_narrow(void* buf, ncclDataType_t t, size_t i, float x) {
    if (t == ncclBfloat16) ((__nv_bfloat16*)buf)[i] = __float2bfloat16(x);
    else ((__half*)buf)[i] = __float2half(x);
}

// reduce in place over the communicator: bf16 and fp16 widened to fp32 and rounded once at the end
static ncclResult_t emu_nccl_allreduce_inplace(void* buf, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm) {
    if (op != ncclSum && op != ncclMax) return ncclInvalidArgument;
    MPI_Op mop = op == ncclSum ? MPI_SUM : MPI_MAX;
    int err;
    if (t == ncclBfloat16 || t == ncclFloat16) {
        std::vector<float> f(count);
        for (size_t i = 0; i < count; i++) f[i] = emu_nccl_widen(buf, t, i);
        err = MPI_Allreduce(MPI_IN_PLACE, f.data(), (int)count, MPI_FLOAT, mop, comm->mpi);
        for (size_t i = 0; i < count; i++) emu_nccl_narrow(buf, t, i, f[i]);
    } else {
        MPI_Datatype mt = t == ncclFloat ? MPI_FLOAT : t == ncclDouble ? MPI_DOUBLE : MPI_INT;
        err = MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, mt, mop, comm->mpi);
    }
    return err == MPI_SUCCESS ? ncclSuccess : ncclSystemError;
}

// the call's data movement, now or held in the stream's queue (an error found then ends the run)
static ncclResult_t emu_nccl_on_stream(cudaStream_t stream, std::function<ncclResult_t()> op) {
    if (stream && stream->capture) emu_fail("%s", "an NCCL call inside a CUDA graph's capture: not emulated (gridgpt captures none)");
    if (!stream || !emu_defer_streams()) return op();
    emu_on_stream(stream, [op] {
        ncclResult_t r = op();
        if (r != ncclSuccess) emu_fail("a collective held on a stream failed: %s", ncclGetErrorString(r));
    });
    return ncclSuccess;
}

static ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    if (emu_nccl_size(t) == 0) return ncclInvalidArgument;
    if (!emu_nccl_on_device(send, count, t) || !emu_nccl_on_device(recv, count, t)) return ncclInvalidArgument;
    return emu_nccl_on_stream(stream, [=] {
        if (send != recv) memmove(recv, send, count * emu_nccl_size(t));
        return emu_nccl_allreduce_inplace(recv, count, t, op, comm);
    });
}

// element i of a gathered buffer, widened to double (every type here is exact in double)
static double emu_nccl_value(const char* buf, ncclDataType_t t, size_t i) {
    switch (t) {
    case ncclFloat: return ((const float*)buf)[i];
    case ncclDouble: return ((const double*)buf)[i];
    case ncclInt32: return ((const int32_t*)buf)[i];
    default: return emu_nccl_widen(buf, t, i);
    }
}

// recv on `root` = each rank's send[count] combined in rank order: in fp32 for float and the
// 16-bit types (rounded once to a 16-bit type at the end), in double for double
static ncclResult_t emu_nccl_reduce_to(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                                       int root, ncclComm_t comm) {
    size_t es = emu_nccl_size(t);
    if (op != ncclSum && op != ncclMax) return ncclInvalidArgument;
    std::vector<char> all(comm->rank == root ? count * es * comm->size : 0);
    if (MPI_Gather(send, (int)(count * es), MPI_BYTE, all.data(), (int)(count * es), MPI_BYTE, root, comm->mpi) != MPI_SUCCESS)
        return ncclSystemError;
    if (comm->rank != root) return ncclSuccess;
    for (size_t i = 0; i < count; i++) {
        double d = emu_nccl_value(all.data(), t, i);
        float f = (float)d;
        for (int r = 1; r < comm->size; r++) {
            double x = emu_nccl_value(all.data() + r * count * es, t, i);
            if (op == ncclSum) d += x, f += (float)x;
            else d = fmax(d, x), f = fmaxf(f, (float)x);
        }
        if (t == ncclDouble) ((double*)recv)[i] = d;
        else if (t == ncclFloat) ((float*)recv)[i] = f;
        else if (t == ncclInt32) ((int32_t*)recv)[i] = (int32_t)d;
        else emu_nccl_narrow(recv, t, i, f);
    }
    return ncclSuccess;
}

// recv on rank `root` = reduction over ranks of send[count]; recv is not touched elsewhere
static ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op, int root,
                               ncclComm_t comm, cudaStream_t stream) {
    if (emu_nccl_size(t) == 0 || root < 0 || root >= comm->size) return ncclInvalidArgument;
    if (!emu_nccl_on_device(send, count, t) || (comm->rank == root && !emu_nccl_on_device(recv, count, t)))
        return ncclInvalidArgument;
    return emu_nccl_on_stream(stream, [=] { return emu_nccl_reduce_to(send, recv, count, t, op, root, comm); });
}

// recv[count] = reduction over ranks of send[rank * count .. +count): a reduce to each rank of its part
static ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    size_t es = emu_nccl_size(t);
    if (es == 0) return ncclInvalidArgument;
    if (!emu_nccl_on_device(send, count * comm->size, t) || !emu_nccl_on_device(recv, count, t)) return ncclInvalidArgument;
    return emu_nccl_on_stream(stream, [=] {
        std::vector<char> mine(count * es);   // send and recv may overlap (in place)
        for (int r = 0; r < comm->size; r++) {
            ncclResult_t res = emu_nccl_reduce_to((const char*)send + r * count * es, mine.data(), count, t, op, r, comm);
            if (res != ncclSuccess) return res;
        }
        memmove(recv, mine.data(), count * es);
        return ncclSuccess;
    });
}

// recv[r * count .. +count) = rank r's send; send may be recv + rank * count (in place)
static ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t t, ncclComm_t comm, cudaStream_t stream) {
    size_t es = emu_nccl_size(t);
    if (es == 0) return ncclInvalidArgument;
    if (!emu_nccl_on_device(send, count, t) || !emu_nccl_on_device(recv, count * comm->size, t)) return ncclInvalidArgument;
    return emu_nccl_on_stream(stream, [=] {
        char* mine = (char*)recv + comm->rank * count * es;
        if (send != mine) memmove(mine, send, count * es);
        int err = MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, (int)(count * es), MPI_BYTE, comm->mpi);
        return err == MPI_SUCCESS ? ncclSuccess : ncclSystemError;
    });
}

// recv[count] on every rank = root's send[count] (in place where send == recv)
static ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t t, int root, ncclComm_t comm,
                                  cudaStream_t stream) {
    size_t es = emu_nccl_size(t);
    if (es == 0 || root < 0 || root >= comm->size) return ncclInvalidArgument;
    if ((comm->rank == root && !emu_nccl_on_device(send, count, t)) || !emu_nccl_on_device(recv, count, t))
        return ncclInvalidArgument;
    return emu_nccl_on_stream(stream, [=] {
        if (comm->rank == root && send != recv) memmove(recv, send, count * es);
        int err = MPI_Bcast(recv, (int)(count * es), MPI_BYTE, root, comm->mpi);
        return err == MPI_SUCCESS ? ncclSuccess : ncclSystemError;
    });
}

static ncclResult_t ncclGroupStart(void) {
    emu_nccl_group_depth++;
    return ncclSuccess;
}

// the group's sends and receives posted together and waited for, on the group's one stream
// (held back under EMU_DEFER_STREAMS=1 like a collective)
static ncclResult_t ncclGroupEnd(void) {
    if (emu_nccl_group_depth == 0) return ncclInvalidUsage;
    if (--emu_nccl_group_depth > 0) return ncclSuccess;
    std::vector<EmuNcclOp> ops;
    ops.swap(emu_nccl_group_ops);
    if (ops.empty()) return ncclSuccess;
    for (const EmuNcclOp& o : ops)   // real NCCL allows several; gridgpt's groups never need them
        if (o.stream != ops[0].stream) return ncclInvalidUsage;
    return emu_nccl_on_stream(ops[0].stream, [ops] {
        std::vector<MPI_Request> reqs(ops.size());
        int err = MPI_SUCCESS;
        for (size_t i = 0; i < ops.size() && err == MPI_SUCCESS; i++) {
            const EmuNcclOp& o = ops[i];
            err = o.send ? MPI_Isend(o.buf, (int)o.bytes, MPI_BYTE, o.peer, 0, o.comm->mpi, &reqs[i])
                         : MPI_Irecv(o.buf, (int)o.bytes, MPI_BYTE, o.peer, 0, o.comm->mpi, &reqs[i]);
        }
        if (err == MPI_SUCCESS) err = MPI_Waitall((int)reqs.size(), reqs.data(), MPI_STATUSES_IGNORE);
        return err == MPI_SUCCESS ? ncclSuccess : ncclSystemError;
    });
}

static ncclResult_t emu_nccl_p2p(bool send, void* buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                                 cudaStream_t stream) {
    if (emu_nccl_size(t) == 0 || peer < 0 || peer >= comm->size) return ncclInvalidArgument;
    if (!emu_nccl_on_device(buf, count, t)) return ncclInvalidArgument;
    ncclGroupStart();
    emu_nccl_group_ops.push_back({send, buf, count * emu_nccl_size(t), peer, comm, stream});
    return ncclGroupEnd();
}

static ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t stream) {
    return emu_nccl_p2p(true, (void*)buf, count, t, peer, comm, stream);
}
static ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t stream) {
    return emu_nccl_p2p(false, buf, count, t, peer, comm, stream);
}

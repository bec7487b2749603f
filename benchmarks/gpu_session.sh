#!/usr/bin/env bash
# Everything cnnpar measures on a lent GPU machine, in phases, writing under OUTDIR.
# usage: benchmarks/gpu_session.sh PHASE OUTDIR
#   (PHASE: smoke | main | extra | rest | verify | frameworks | jpeg | jpeg_e2e | final | jpeg_pipeline |
#    claims_ladder | tune50 | record | s5cifar | s6a | s6b | s6c | s6d | s7a-s7d | s8a | frameworks)
  # issue 5 on the GPU: needs .devdata/mnist.npz and keras, namex, optree wheels (cp312) in .whl/.
  # JAX cannot travel: jaxlib + the CUDA plugin and PJRT wheels are ~230 MB against the 64 MiB carry
  # limit, so JAX on the GPU is out of reach of this tool; Keras runs on its torch backend there.
  run 560 python3 -m cnnpar compare --frameworks torch,keras-torch --data .devdata/mnist.npz \
      --epochs 3 --batch-size 128 --out "$R/frameworks_h200"
  ;;
esac
tar czf "$OUTDIR/results.tgz" -C "$OUTDIR" results && echo "packed $(du -sh "$OUTDIR/results.tgz")"

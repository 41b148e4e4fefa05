# A hand-made graph with known answers (see tests/run_graph.sh):
# K4 on 1..4 (4 triangles), a triangle 10-11-12 with a tail 12-13 (1 triangle),
# an isolated edge 20-21, a square 30-31-32-33 (no triangle), a self loop on 5
# and the edge 1-2 given twice (once reversed).
# 14 vertices, 15 edges, 5 triangles, maximum degree 3 (vertices 1-4 and 12; hub 1).
1 2
1 3
1 4
2 3
2 4
3 4
10 11
11 12
12 10
12 13

20	21
% a comment in Matrix Market style
30 31
31 32
32 33
33 30
5 5
2 1
